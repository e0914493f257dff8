//! `vserve check`: decode every video of a dataset whole with the daemon's own code and report its
//! health, without a daemon ([`crate::check`]) or inside one (`--daemon ADDR`, the CheckDataset RPC).
//!
//! Output: one line per video on stdout as it finishes (a table, or JSON objects with `--json`:
//! `video`, `status` ok|damaged|unreadable|quarantined, `frames`, `decodable_frames`, `first_bad_frame`,
//! `reason`, `seconds`), then a summary (files and hours of video by status); a progress bar (files/s,
//! ETA) on stderr when it is a terminal. Results land in the store of `--state-dir` (the daemon's with
//! `--daemon`). Exit: 0 every video ok, 1 some not, 64 bad flags, 69 the daemon could not run the check,
//! 74 an unusable state directory.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::check::{Shard, Summary, VideoReport};
use crate::cli::{AddrArgs, CheckArgs};
use crate::dataset::Dataset;
use crate::state::StateDir;
use crate::store::Store;

pub(super) const USAGE: u8 = 64;
const UNAVAILABLE: u8 = 69;
pub(super) const IO: u8 = 74;

fn usage(msg: String) -> ExitCode {
    eprintln!("vserve check: {msg}");
    ExitCode::from(USAGE)
}

/// Runs `vserve check`.
pub fn run(args: &CheckArgs) -> ExitCode {
    let shard = match args.shard.as_deref().map(Shard::parse).transpose() {
        Ok(s) => s.unwrap_or(Shard::ALL),
        Err(e) => return usage(e),
    };
    if args.jobs == Some(0) {
        return usage("--jobs must be at least 1".into());
    }
    let mut out = Output::new(args.json, "check", VideoReport::is_ok);
    let summary = match &args.daemon {
        Some(addr) => match in_daemon(args, addr, shard, &mut out) {
            Ok(s) => s,
            Err(code) => return code,
        },
        None => match here(args, shard, &mut out) {
            Ok(s) => s,
            Err(code) => return code,
        },
    };
    out.summary(&summary);
    if let Some(why) = crate::check::UNSTORED.report() {
        eprintln!("vserve check: {why}");
        return ExitCode::from(IO);
    }
    if summary.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The check in this process.
fn here(args: &CheckArgs, shard: Shard, out: &mut Output) -> Result<Summary, ExitCode> {
    let local = Local::open(
        "check",
        &args.dataset,
        shard,
        args.state_dir.as_deref(),
        args.store_bytes.as_deref(),
    )?;
    let mut summary = Summary::default();
    out.begin(local.videos.len());
    crate::check::run(
        &local.ds,
        &local.videos,
        local.jobs(args.jobs),
        local.store.as_ref(),
        |r, _, done, _| {
            summary.add(&r);
            out.video(&r, done);
            true
        },
    );
    Ok(summary)
}

/// A dataset on this host (`NAME=DIR[:manifest=FILE]`), the shard of its videos to visit, and the
/// store of a state directory: what `vserve check` and `vserve index` work on without a daemon.
pub(super) struct Local {
    pub ds: Dataset,
    /// Sorted, distinct, this shard's only.
    pub videos: Vec<String>,
    pub store: Option<Store>,
}

impl Local {
    /// Errors: usage (64) for a bad dataset or size, 74 for an unusable state directory.
    pub fn open(
        verb: &str,
        dataset: &str,
        shard: Shard,
        state_dir: Option<&std::path::Path>,
        store_bytes: Option<&str>,
    ) -> Result<Local, ExitCode> {
        let usage = |msg: String| {
            eprintln!("vserve {verb}: {msg}");
            ExitCode::from(USAGE)
        };
        let d = crate::config::parse_dataset(dataset).map_err(|e| usage(e.to_string()))?;
        let ds = Dataset::new(&d.name, &d.root)
            .map_err(|e| usage(format!("dataset {:?}: root {:?}: {e}", d.name, d.root)))?;
        if crate::gulp::is_gulp_dir(&ds.root) {
            return Err(usage(format!(
                "{} holds a GulpIO dataset of stored frames; check it with `vserve gulp-check`",
                ds.root.display()
            )));
        }
        let mut videos = crate::check::videos(&ds, d.manifest.as_deref()).map_err(usage)?;
        videos.retain(|v| shard.contains(v));
        let store_bytes = match store_bytes {
            Some(s) => {
                crate::config::parse_bytes("store-bytes", s).map_err(|e| usage(e.to_string()))?
            }
            None => crate::store::DEFAULT_MAX_BYTES,
        };
        if store_bytes == 0 {
            return Err(usage("--store-bytes 0: must be at least 1 byte".into()));
        }
        let state_dir = match state_dir {
            Some(d) if d.as_os_str() == "none" => None,
            Some(d) => Some(d.to_owned()),
            None => crate::state::default_dir(),
        };
        let store = match &state_dir {
            Some(dir) => match StateDir::open(dir) {
                Ok(s) => Some(Store::open(&s, store_bytes)),
                Err(e) => {
                    eprintln!("vserve {verb}: state directory {}: {e}", dir.display());
                    return Err(ExitCode::from(IO));
                }
            },
            None => None,
        };
        Ok(Local { ds, videos, store })
    }

    /// `--jobs`, else the cores.
    pub fn jobs(&self, jobs: Option<usize>) -> usize {
        jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// The check inside a daemon, through CheckDataset.
fn in_daemon(
    args: &CheckArgs,
    addr: &str,
    shard: Shard,
    out: &mut Output,
) -> Result<Summary, ExitCode> {
    if args.dataset.contains('=') {
        return Err(usage(format!(
            "--dataset {:?}: with --daemon, give the NAME of a dataset the daemon serves",
            args.dataset
        )));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("vserve check: cannot start a runtime: {e}");
            ExitCode::from(UNAVAILABLE)
        })?;
    let addr_args = AddrArgs {
        addr: addr.to_owned(),
        token_file: args.token_file.clone(),
        tls_ca: args.tls_ca.clone(),
    };
    let req = vserve_client::proto::CheckDatasetRequest {
        dataset: args.dataset.clone(),
        jobs: args.jobs.unwrap_or(1) as u32,
        shard_index: shard.index,
        shard_count: shard.count,
    };
    rt.block_on(async {
        let failed = |e: vserve_client::ClientError| {
            eprintln!("{e}");
            ExitCode::from(UNAVAILABLE)
        };
        let mut client = super::connect(&addr_args).await.map_err(|e| match e {
            super::CommandError::Client(e) => failed(e),
            local => {
                eprintln!("{local}");
                ExitCode::from(local.exit_code())
            }
        })?;
        let mut replies = client.check_dataset(req).await.map_err(failed)?;
        let mut summary = Summary::default();
        let mut begun = false;
        loop {
            let msg = match replies.message().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(status) => return Err(failed(status.into())),
            };
            if !begun {
                out.begin(msg.total as usize);
                begun = true;
            }
            let Some(v) = msg.video else { continue };
            let r = VideoReport {
                video: v.video,
                status: v.status,
                frames: v.frames,
                decodable_frames: v.decodable_frames,
                first_bad_frame: v.first_bad_frame,
                reason: (!v.reason.is_empty()).then_some(v.reason),
                seconds: v.seconds,
            };
            summary.add(&r);
            out.video(&r, msg.done as usize);
        }
        Ok(summary)
    })
}

/// Result lines on stdout, the progress bar on stderr.
pub(super) struct Output {
    json: bool,
    /// The subcommand, naming the bar.
    verb: &'static str,
    /// Whether a result counts as fine (others are counted on the bar).
    ok: fn(&VideoReport) -> bool,
    /// Draw the bar (stderr is a terminal).
    bar: bool,
    /// Clear the bar before each stdout line (stdout is that terminal too).
    clear: bool,
    started: Instant,
    last_draw: Instant,
    total: usize,
    not_ok: usize,
}

impl Output {
    pub fn new(json: bool, verb: &'static str, ok: fn(&VideoReport) -> bool) -> Output {
        let bar = std::io::stderr().is_terminal();
        Output {
            json,
            verb,
            ok,
            bar,
            clear: bar && std::io::stdout().is_terminal(),
            started: Instant::now(),
            last_draw: Instant::now() - Duration::from_secs(1),
            total: 0,
            not_ok: 0,
        }
    }

    pub fn begin(&mut self, total: usize) {
        self.total = total;
        self.started = Instant::now();
        if !self.json {
            println!(
                "{:<11} {:>8} {:>10} {:>9}  video (reason)",
                "status", "frames", "decodable", "first_bad"
            );
        }
    }

    pub fn video(&mut self, r: &VideoReport, done: usize) {
        if !(self.ok)(r) {
            self.not_ok += 1;
        }
        let mut stdout = std::io::stdout().lock();
        if self.clear {
            eprint!("\r\x1b[K");
        }
        let line = if self.json {
            serde_json::to_string(r).unwrap_or_default()
        } else {
            format!(
                "{:<11} {:>8} {:>10} {:>9}  {}{}",
                r.status,
                r.frames,
                r.decodable_frames,
                r.first_bad_frame
                    .map_or_else(|| "-".into(), |f| f.to_string()),
                r.video,
                r.reason
                    .as_ref()
                    .map_or_else(String::new, |m| format!(" ({m})"))
            )
        };
        super::line_out(&mut stdout, &line);
        drop(stdout);
        self.draw(done, done >= self.total);
    }

    fn draw(&mut self, done: usize, last: bool) {
        if !self.bar || (!last && self.last_draw.elapsed() < Duration::from_millis(100)) {
            return;
        }
        self.last_draw = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = done as f64 / secs;
        let eta = if done > 0 && done < self.total {
            let left = (secs / done as f64 * (self.total - done) as f64) as u64;
            format!("{}m{:02}s", left / 60, left % 60)
        } else {
            "-".into()
        };
        let width = 30;
        let filled = (done * width).checked_div(self.total).unwrap_or(width);
        eprint!(
            "\r\x1b[K{} [{}{}] {done}/{} files, {rate:.1} files/s, ETA {eta}{}",
            self.verb,
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.total,
            if self.not_ok > 0 {
                format!(", {} not ok", self.not_ok)
            } else {
                String::new()
            }
        );
        if last {
            eprintln!();
        }
    }

    pub fn summary(&mut self, s: &Summary) {
        if self.json {
            println!("{}", s.to_json());
        } else {
            println!("{}", s.text());
        }
    }
}
