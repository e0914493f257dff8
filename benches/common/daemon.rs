//! The benches' daemon harness (shared by `benches/uniform.rs` and `benches/streams.rs`): starts
//! `vserve serve` on a fresh Unix socket over the given datasets with no admin listener (benches may run
//! beside other daemons on the default admin port), waits until it answers, and stops it with SIGTERM (its
//! drain timed) or kills it when dropped. The daemon's stdout and stderr go to a log file whose tail is
//! shown when it fails to start. (Each bench uses part of it.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use vserve_client::Client;

pub struct Daemon {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
    /// The socket, state and (unless given) log live here.
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts `bin serve` over `datasets` (name, root) with `extra` arguments; its output goes to `log`
    /// (a file in a temp dir when `None`).
    pub fn spawn(
        bin: &Path,
        datasets: &[(&str, &Path)],
        extra: &[String],
        log: Option<PathBuf>,
    ) -> Result<Daemon> {
        let dir = tempfile::Builder::new().prefix("vserve-bench").tempdir()?;
        let socket = dir.path().join("vserve.sock");
        let log = log.unwrap_or_else(|| dir.path().join("daemon.log"));
        if let Some(parent) = log.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let log_file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()));
        for (name, root) in datasets {
            cmd.arg("--dataset")
                .arg(format!("{name}={}", root.display()));
        }
        cmd.args(extra)
            // Env, not flags, so older binaries without them still start.
            .env("VSERVE_ADMIN_LISTEN", "none")
            .env("VSERVE_STATE_DIR", dir.path().join("state"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        eprintln!("bench: starting {cmd:?}");
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Daemon {
            child: Some(child),
            socket,
            log,
            _dir: dir,
        })
    }

    pub fn addr(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    /// The daemon's pid (for CPU and memory counters).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Waits (up to `timeout`) until the daemon answers ListDatasets on its socket.
    pub async fn connect(&mut self, timeout: Duration) -> Result<Client> {
        let addr = self.addr();
        let deadline = Instant::now() + timeout;
        let mut last_err = String::from("socket never appeared");
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "the daemon exited ({status}) before serving; log {}:\n{}",
                        self.log.display(),
                        self.log_tail()
                    );
                }
            }
            if self.socket.exists() {
                match Client::connect(&addr).await {
                    Ok(mut c) => match c.list_datasets().await {
                        Ok(_) => return Ok(c),
                        Err(e) => last_err = e.to_string(),
                    },
                    Err(e) => last_err = e.to_string(),
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon did not answer on {addr} within {timeout:?} ({last_err}); log {}:\n{}",
                    self.log.display(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last 20 lines of the daemon's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM, then SIGKILL after 10 s. Returns the seconds the daemon took to exit (None: killed).
    pub fn stop(&mut self) -> Option<f64> {
        let mut child = self.child.take()?;
        let start = Instant::now();
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return Some(start.elapsed().as_secs_f64()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    eprintln!("bench: the daemon ignored SIGTERM for 10 s; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
