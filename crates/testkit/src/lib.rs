//! The one daemon harness of vserve's integration tests (`tests/common`) and benches (`benches/*.rs`):
//! it runs the built `vserve` binary as a child process the way an operator would, never the library
//! in-process, so what is tested and timed is the daemon's own start-up, listeners, signals and drain.
//!
//! Inputs: the binary (`env!("CARGO_BIN_EXE_vserve")` of the calling test or bench, or a path), datasets
//! as `NAME=ROOT`, extra `serve` flags and environment. What it owns:
//! - a temp dir per daemon (removed when the [`Daemon`] drops) holding the Unix socket the daemon serves
//!   gRPC on, its state directory and (unless a path is given) its log;
//! - the admin listener: an ephemeral `127.0.0.1:0` port by default (tests run in parallel; the default
//!   port would collide), or none;
//! - readiness: [`Daemon::ready`] waits until the socket answers ListDatasets, failing early (with the
//!   log's tail) when the daemon exits first;
//! - the log (stdout and stderr), read back for listener addresses and shown when something fails;
//! - stopping: [`Daemon::stop`] sends SIGTERM and waits for the exit (the drain), killing it after a
//!   grace period; a dropped daemon is killed.
//!
//! The state directory and admin listener are passed as `VSERVE_STATE_DIR` / `VSERVE_ADMIN_LISTEN`
//! environment, not flags, so a `--state-dir` or `--admin-listen` among the caller's arguments overrides
//! them (clap prefers a flag to its env) and an older binary without those flags still starts (benches
//! compare builds). The caller's own environment is applied after them and wins too.
//!
//! Errors are `anyhow` with the log's tail attached: the benches propagate them, the tests panic on them.

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use vserve_client::Client;

/// The shared media corpus (`../shared/media` from the repository root; see its MANIFEST.md).
pub fn media_dir() -> Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/media");
    fs::canonicalize(&dir).with_context(|| format!("media corpus {}", dir.display()))
}

/// How a daemon is started; [`DaemonBuilder::spawn`] starts it.
pub struct DaemonBuilder {
    bin: PathBuf,
    dir: tempfile::TempDir,
    datasets: Vec<(String, PathBuf)>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    admin: Option<String>,
    log: Option<PathBuf>,
    address_space: Option<u64>,
    user: Option<u32>,
}

impl DaemonBuilder {
    /// The daemon's temp dir, made now so a caller can put datasets in it before the start.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Serves `root` as dataset `name` (`--dataset NAME=ROOT`).
    pub fn dataset(mut self, name: &str, root: &Path) -> Self {
        self.datasets.push((name.to_owned(), root.to_owned()));
        self
    }

    /// Extra `serve` arguments, after the harness's own.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Extra environment variables for the daemon (applied last: they override the harness's).
    pub fn envs<I, K, V>(mut self, env: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        self.env
            .extend(env.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// The admin listener: `Some(addr)`, or `None` for no admin listener. Default `127.0.0.1:0`.
    pub fn admin(mut self, addr: Option<&str>) -> Self {
        self.admin = addr.map(str::to_owned);
        self
    }

    /// Writes the daemon's output to `path` (kept after the daemon) instead of the temp dir.
    pub fn log_file(mut self, path: PathBuf) -> Self {
        self.log = Some(path);
        self
    }

    /// Runs the daemon under an address-space limit (`RLIMIT_AS`, bytes): an allocation beyond it fails
    /// (and aborts the daemon) instead of eating the machine's memory.
    pub fn address_space(mut self, bytes: u64) -> Self {
        self.address_space = Some(bytes);
        self
    }

    /// Runs the daemon as user and group `id` with no supplementary groups (the caller must be root):
    /// its temp dir becomes that user's, mode 0711, so it can make its state and socket there and
    /// clients of any user can reach the socket.
    pub fn user(mut self, id: u32) -> Self {
        self.user = Some(id);
        self
    }

    /// Starts `vserve serve` (without waiting for it: see [`Daemon::ready`]).
    pub fn spawn(self) -> Result<Daemon> {
        let socket = self.dir.path().join("vserve.sock");
        let addr = format!("unix:{}", socket.display());
        let log = self
            .log
            .clone()
            .unwrap_or_else(|| self.dir.path().join("daemon.log"));
        if let Some(parent) = log.parent() {
            fs::create_dir_all(parent).with_context(|| format!("log dir {}", parent.display()))?;
        }
        let log_file =
            fs::File::create(&log).with_context(|| format!("log file {}", log.display()))?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("serve").arg("--listen").arg(&addr);
        for (name, root) in &self.datasets {
            cmd.arg("--dataset")
                .arg(format!("{name}={}", root.display()));
        }
        cmd.args(&self.args)
            .env(
                "VSERVE_ADMIN_LISTEN",
                self.admin.as_deref().unwrap_or("none"),
            )
            .env("VSERVE_STATE_DIR", self.dir.path().join("state"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().context("log file")?)
            .stderr(log_file);
        if let Some(limit) = self.address_space {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit {
                rlim_cur: limit as libc::rlim_t,
                rlim_max: limit as libc::rlim_t,
            };
            // SAFETY: runs in the forked child before exec; setrlimit is async-signal-safe and the
            // closure touches only its own copy of `lim`.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if let Some(id) = self.user {
            use std::os::unix::fs::PermissionsExt;
            use std::os::unix::process::CommandExt;
            std::os::unix::fs::chown(self.dir.path(), Some(id), Some(id))
                .context("chown temp dir")?;
            fs::set_permissions(self.dir.path(), fs::Permissions::from_mode(0o711))
                .context("chmod temp dir")?;
            // As root, std drops the supplementary groups (setgroups(0)) before setgid and setuid.
            cmd.uid(id).gid(id);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        Ok(Daemon {
            child,
            exited: None,
            socket,
            addr,
            log,
            admin: None,
            dir: self.dir,
        })
    }
}

/// A running `vserve serve`, killed when dropped.
pub struct Daemon {
    child: Child,
    /// Its exit status, once seen.
    exited: Option<ExitStatus>,
    socket: PathBuf,
    addr: String,
    log: PathBuf,
    admin: Option<String>,
    dir: tempfile::TempDir,
}

impl Daemon {
    /// A builder for a daemon of `bin`, with a fresh temp dir (named `prefix…`).
    pub fn builder(bin: impl Into<PathBuf>, prefix: &str) -> Result<DaemonBuilder> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .context("temp dir")?;
        Ok(DaemonBuilder {
            bin: bin.into(),
            dir,
            datasets: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            admin: Some("127.0.0.1:0".to_owned()),
            log: None,
            address_space: None,
            user: None,
        })
    }

    /// `unix:/…/vserve.sock`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The Unix socket file.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon's temp dir (socket, state, log unless given elsewhere).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin listener's `HOST:PORT` as the daemon logged it (known once [`Daemon::ready`] returned),
    /// or None without one.
    pub fn admin(&self) -> Option<&str> {
        self.admin.as_deref()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (up to `timeout`) until the daemon answers ListDatasets on its socket; returns that client.
    /// Fails, with the log's tail, when the daemon exits first or does not answer in time.
    pub async fn ready(&mut self, timeout: Duration) -> Result<Client> {
        let deadline = Instant::now() + timeout;
        let mut last_err = String::from("socket never appeared");
        loop {
            if let Some(status) = self.try_wait() {
                bail!(
                    "vserve exited during start-up with {status}; log {}:\n{}",
                    self.log.display(),
                    self.log_text()
                );
            }
            if self.socket.exists() {
                match Client::connect(&self.addr).await {
                    // Ready once every dataset's first walk is complete (the daemon answers before).
                    Ok(mut c) => match c.list_datasets().await {
                        Ok(r) if r.datasets.iter().all(|d| !d.building) => {
                            self.admin = self.logged_addr("admin listening");
                            // The daemon answers on its first listener a moment before it marks itself
                            // ready (after every listener is up): wait for /readyz too, so a test's
                            // first look at it does not race start-up.
                            let ready = match &self.admin {
                                Some(a) => {
                                    http_get(a, "/readyz").is_ok_and(|(code, _)| code == 200)
                                }
                                None => true,
                            };
                            if ready {
                                return Ok(c);
                            }
                            last_err = "/readyz not 200 yet".into();
                        }
                        Ok(_) => last_err = "datasets still being listed".into(),
                        Err(e) => last_err = e.to_string(),
                    },
                    Err(e) => last_err = e.to_string(),
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "vserve did not answer on {} within {timeout:?} ({last_err}); log {}:\n{}",
                    self.addr,
                    self.log.display(),
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The daemon's exit status if it has exited (remembered once seen).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// Whether the daemon process is still alive.
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// Sends a signal (`TERM`, `INT`, `KILL`, …) to the daemon.
    pub fn signal(&self, name: &str) -> Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{name} {} failed ({status})", self.pid());
        }
        Ok(())
    }

    /// Waits (serving the async runtime) until the daemon exits: its exit code (None: killed by a
    /// signal), or None when it is still running after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<Option<i32>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status.code());
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, then SIGKILL after `grace`. Blocking (a bench calls it outside its runtime). Returns the
    /// seconds the daemon took to exit on its own (None: it had to be killed or was already gone).
    pub fn stop(&mut self, grace: Duration) -> Option<f64> {
        if self.try_wait().is_some() {
            return None;
        }
        let start = Instant::now();
        let _ = self.signal("TERM");
        loop {
            if self.try_wait().is_some() {
                return Some(start.elapsed().as_secs_f64());
            }
            if start.elapsed() > grace {
                eprintln!(
                    "vserve {} ignored SIGTERM for {grace:?}; killing it",
                    self.pid()
                );
                let _ = self.child.kill();
                self.exited = self.child.wait().ok();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's resident memory (`VmRSS` of /proc/PID/status), in bytes.
    pub fn rss_bytes(&self) -> Result<u64> {
        let path = format!("/proc/{}/status", self.pid());
        let status = fs::read_to_string(&path).with_context(|| path.clone())?;
        let kib: u64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no VmRSS in {path}"))?;
        Ok(kib * 1024)
    }

    /// The log's path.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log's last 8000 bytes (lossy: a stray non-UTF-8 byte does not hide the rest).
    pub fn log_text(&self) -> String {
        let text = String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned();
        let keep = 8000;
        if text.len() > keep {
            let mut cut = text.len() - keep;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            format!("[…]{}", &text[cut..])
        } else {
            text
        }
    }

    /// The `addr=` of the first log line containing `what` (text or JSON logs).
    pub fn logged_addr(&self, what: &str) -> Option<String> {
        self.logged_addrs(what).into_iter().next()
    }

    /// The `addr=` of every log line containing `what`.
    pub fn logged_addrs(&self, what: &str) -> Vec<String> {
        let text = String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned();
        text.lines()
            .filter(|l| l.contains(what))
            .filter_map(|l| {
                let rest = l
                    .split_once("addr=")
                    .or_else(|| l.split_once("\"addr\":\""))?
                    .1;
                let end = rest.find([' ', '"']).unwrap_or(rest.len());
                Some(rest[..end].to_owned())
            })
            .collect()
    }

    /// The TCP address the daemon serves gRPC on (from its log), for a daemon given a TCP `--listen`.
    /// Listeners are bound and logged one after another, so the Unix socket may answer before the TCP
    /// line is in the log: waits up to 10 s for it.
    pub fn tcp_addr(&self) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self
                .logged_addrs("listening")
                .into_iter()
                .find(|a| !a.starts_with("unix:") && Some(a.as_str()) != self.admin());
            if found.is_some() || Instant::now() > deadline || self.exited.is_some() {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET path` on the admin listener: (status code, body).
    pub fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        let addr = self.admin().context("the daemon has no admin listener")?;
        http_get(addr, path)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A minimal HTTP/1.1 GET (the admin endpoints): (status code, body). Blocking: the server is another
/// process and the replies are small.
pub fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let mut stream =
        std::net::TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).context("send")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).context("read reply")?;
    let text = String::from_utf8(raw).context("utf-8 reply")?;
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("reply without a header: {text:?}");
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("bad status line: {head}"))?;
    Ok((status, body.to_owned()))
}
