//! `streams`: StreamBatches on DESIGN.md's `train` workload, several readers at once.
//!
//! ```text
//! cargo bench --bench streams -- [--dir DIR] [--threads N] [--repeat N] [--step-ms MS]
//! ```
//!
//! Corpus: `--dir`, else `target/bench-corpus/kinetics-like-v1` (built by `cargo bench --bench uniform`,
//! which documents the ffmpeg commands). Workload `train`: per video one random clip of 8 frames with
//! stride 4, short side 256, random crop 224, random flip, batch 32.
//!
//! `--clips-per-video` (default 4) makes the epoch long enough to time on a small corpus.
//!
//! Phases, each on a fresh daemon (`--decode-threads N`, empty cache) so every phase starts cold:
//! 1. `one stream`: rank 0 of world 1 reads the whole epoch: clips/s, the floor for the others.
//! 2. `two ranks`: ranks 0 and 1 of world 2 read at once (disjoint halves): clips/s each and together,
//!    and the time a trainer waits for each batch (p50/p99; the trainer "computes" `--step-ms` between
//!    batches). Together / one stream ≈ 1 means the two ranks share the fleet without loss.
//! 3. `shared`: two jobs (both world 1, same seed and epoch, so the same clips) read at once: frames
//!    decoded ÷ frames delivered from GetStats, absolute and relative to phase 1's one job (aim ≤ 0.55:
//!    each GOP run decoded once for both; random clips in 250-frame GOPs decode several frames per frame
//!    delivered even for one job, so the absolute ratio cannot reach 0.55 on that corpus).
//! 4. `fair`: two jobs on different clips (seeds differ), one with prefetch 1 and one with prefetch 8:
//!    clips/s of each while both run (fair share: about equal).
//!
//! `--gpus LIST` (default `none`) and `--nvdec-sessions N` are passed to the daemon, so the same workload
//! compares the CPU backend (`--gpus none`) with NVDEC (`--gpus 0`, on a GPU machine); each phase also
//! reports the daemon's CPU seconds (user + system, from /proc) per clip.
//!
//! Prints a table and writes `target/bench-results/streams.json`. Nothing is asserted.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use vserve_client::{proto, Client};

use vserve_testkit::Daemon;

#[derive(Parser, Debug)]
struct Args {
    /// Folder of videos (default: the uniform bench's corpus).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Decode threads of the daemon.
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(2, |n| n.get()))]
    threads: usize,
    /// Trials per phase; the fastest counts (other load only slows a run down).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Clips per video (the train workload has 1; more make the epoch long enough to time).
    #[arg(long, default_value_t = 4)]
    clips_per_video: u32,
    /// Simulated training step between batches, in milliseconds.
    #[arg(long, default_value_t = 0)]
    step_ms: u64,
    /// The daemon's --gpus (none: the CPU backend; 0 or all: NVDEC on a GPU machine).
    #[arg(long, default_value = "none")]
    gpus: String,
    /// The daemon's --nvdec-sessions (NVDEC decode threads per GPU).
    #[arg(long)]
    nvdec_sessions: Option<usize>,
    /// The daemon binary (default: the one Cargo built next to this bench).
    #[arg(long)]
    vserve: Option<PathBuf>,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    _filters: Vec<String>,
}

/// The daemon of a bench run, over `root` as dataset `bench`.
async fn start_daemon(bin: &Path, root: &Path, args: &Args) -> Result<Daemon> {
    let mut extra = vec![
        "--decode-threads".to_owned(),
        args.threads.to_string(),
        "--cache-bytes".to_owned(),
        "8GiB".to_owned(),
        "--gpus".to_owned(),
        args.gpus.clone(),
    ];
    if let Some(n) = args.nvdec_sessions {
        extra.extend(["--nvdec-sessions".to_owned(), n.to_string()]);
    }
    // No admin listener: benches may run beside other daemons on the default admin port.
    let mut d = Daemon::builder(bin, "vserve-bench")?
        .dataset("bench", root)
        .args(&extra)
        .admin(None)
        .spawn()?;
    d.ready(Duration::from_secs(30)).await?;
    Ok(d)
}

fn train(
    clips: u32,
    seed: u64,
    rank: u32,
    world: u32,
    prefetch: u32,
) -> proto::StreamBatchesRequest {
    proto::StreamBatchesRequest {
        dataset: "bench".into(),
        sampler: Some(proto::ClipSampler {
            kind: proto::SamplerKind::SamplerRandomIndices as i32,
            num_clips: clips,
            frames_per_clip: 8,
            frame_stride: 4,
            ..Default::default()
        }),
        transform: Some(proto::Transform {
            resize: Some(proto::transform::Resize::ShortSide(256)),
            ..Default::default()
        }),
        augment: Some(proto::Augment {
            crop: Some(proto::augment::Crop::RandomCrop(proto::Size {
                width: 224,
                height: 224,
            })),
            random_hflip: true,
        }),
        batch_size: 32,
        seed,
        rank,
        world_size: world,
        prefetch,
        ..Default::default()
    }
}

#[derive(Debug, Clone, serde::Serialize)]
struct Reader {
    clips: u64,
    seconds: f64,
    clips_per_s: f64,
    wait_p50_ms: f64,
    wait_p99_ms: f64,
    /// (seconds since the phase started, clips so far) after each batch.
    #[serde(skip)]
    arrivals: Vec<(f64, u64)>,
}

impl Reader {
    /// Clips received by `t` seconds after the phase started.
    fn clips_by(&self, t: f64) -> u64 {
        self.arrivals
            .iter()
            .take_while(|a| a.0 <= t)
            .last()
            .map_or(0, |a| a.1)
    }
}

/// Reads a whole stream; the wait per batch is the time `next()` blocks.
async fn read(
    addr: String,
    req: proto::StreamBatchesRequest,
    step: Duration,
    phase_start: Instant,
) -> Result<Reader> {
    let mut c = Client::connect(&addr).await?;
    let started = Instant::now();
    let mut arrivals = Vec::new();
    let mut s = c.stream_batches(req).await?;
    let mut waits = Vec::new();
    let mut clips = 0;
    loop {
        let asked = Instant::now();
        let Some(b) = s.next().await? else { break };
        waits.push(asked.elapsed().as_secs_f64() * 1e3);
        clips += b.header.clips.len() as u64;
        arrivals.push((phase_start.elapsed().as_secs_f64(), clips));
        if !step.is_zero() {
            tokio::time::sleep(step).await;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    waits.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        waits
            .get(((waits.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok(Reader {
        clips,
        seconds,
        clips_per_s: clips as f64 / seconds,
        wait_p50_ms: pct(0.5),
        wait_p99_ms: pct(0.99),
        arrivals,
    })
}

/// Runs readers at once on a fresh daemon; returns each reader and GetStats after.
async fn phase(
    args: &Args,
    bin: &Path,
    root: &Path,
    reqs: Vec<proto::StreamBatchesRequest>,
) -> Result<(Vec<Reader>, proto::GetStatsResponse, f64, f64)> {
    let d = start_daemon(bin, root, args).await?;
    let pid = d.pid();
    let cpu_before = cpu_seconds(pid);
    let step = Duration::from_millis(args.step_ms);
    let started = Instant::now();
    let tasks: Vec<_> = reqs
        .into_iter()
        .map(|r| tokio::spawn(read(d.addr().to_owned(), r, step, started)))
        .collect();
    let mut readers = Vec::new();
    for t in tasks {
        readers.push(t.await??);
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu_before;
    let stats = Client::connect(d.addr()).await?.stats().await?;
    Ok((readers, stats, wall, cpu))
}

/// CPU seconds (user + system) process `pid` has used, from /proc (0 where unreadable).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th overall.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = args
        .dir
        .clone()
        .unwrap_or_else(|| manifest.join("target/bench-corpus/kinetics-like-v1"));
    if !root.is_dir() {
        bail!(
            "no corpus at {}: build it with `cargo bench --bench uniform` or pass --dir",
            root.display()
        );
    }
    let bin = args
        .vserve
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vserve")));
    let mut report = serde_json::Map::new();
    let best = |runs: &[(Vec<Reader>, proto::GetStatsResponse, f64, f64)]| {
        runs.iter()
            .min_by(|a, b| a.2.total_cmp(&b.2))
            .cloned()
            .expect("one run")
    };
    let trials = |reqs: Vec<proto::StreamBatchesRequest>| {
        let args = &args;
        let bin = bin.clone();
        let root = root.clone();
        async move {
            let mut runs = Vec::new();
            for _ in 0..args.repeat.max(1) {
                runs.push(phase(args, &bin, &root, reqs.clone()).await?);
            }
            anyhow::Ok(best(&runs))
        }
    };

    let n = args.clips_per_video;
    let (one, one_stats, one_wall, one_cpu) = trials(vec![train(n, 1, 0, 1, 2)]).await?;
    let one_rate = one[0].clips as f64 / one_wall;
    let one_cpu_per_clip = one_cpu / one[0].clips.max(1) as f64;
    println!(
        "one stream:  {:>5} clips in {one_wall:6.2} s  {one_rate:7.1} clips/s  wait p50 {:6.1} ms  p99 {:6.1} ms  daemon CPU {:.4} s/clip (--gpus {})",
        one[0].clips, one[0].wait_p50_ms, one[0].wait_p99_ms, one_cpu_per_clip, args.gpus
    );

    let (two, _, two_wall, two_cpu) =
        trials(vec![train(n, 1, 0, 2, 2), train(n, 1, 1, 2, 2)]).await?;
    let two_clips: u64 = two.iter().map(|r| r.clips).sum();
    let two_rate = two_clips as f64 / two_wall;
    for (i, r) in two.iter().enumerate() {
        println!(
            "two ranks, rank {i}: {:>5} clips  {:7.1} clips/s  wait p50 {:6.1} ms  p99 {:6.1} ms",
            r.clips, r.clips_per_s, r.wait_p50_ms, r.wait_p99_ms
        );
    }
    let two_cpu_per_clip = two_cpu / two_clips.max(1) as f64;
    println!(
        "two ranks together: {two_rate:7.1} clips/s = {:.2} × one stream  daemon CPU {two_cpu_per_clip:.4} s/clip",
        two_rate / one_rate
    );

    let (shared, shared_stats, shared_wall, _) =
        trials(vec![train(n, 1, 0, 1, 2), train(n, 1, 0, 1, 2)]).await?;
    let delivered: u64 = shared.iter().map(|r| r.clips * 8).sum();
    let ratio = shared_stats.frames_decoded as f64 / delivered as f64;
    let one_ratio = one_stats.frames_decoded as f64 / (one[0].clips * 8) as f64;
    println!(
        "one stream alone: {} frames delivered, {} decoded: decoded/delivered = {one_ratio:.3} (random clips in long GOPs decode from the keyframe)",
        one[0].clips * 8,
        one_stats.frames_decoded
    );
    println!(
        "shared (2 jobs, same clips): {delivered} frames delivered, {} decoded (+{} skipped unread): decoded/delivered = {ratio:.3}, = {:.3} of one job's (aim <= 0.55: each GOP run decoded once for both); {} frames shared in flight; {:.1} s",
        shared_stats.frames_decoded, shared_stats.frames_skipped, ratio / one_ratio, shared_stats.shared_frames, shared_wall
    );

    let (fair, _, fair_wall, _) = trials(vec![train(n, 3, 0, 1, 1), train(n, 4, 0, 1, 8)]).await?;
    // Fair share while both read: clips each had received when the first finished.
    let first_done = fair
        .iter()
        .map(|r| r.arrivals.last().map_or(0.0, |a| a.0))
        .fold(f64::INFINITY, f64::min);
    let (a, b) = (fair[0].clips_by(first_done), fair[1].clips_by(first_done));
    println!(
        "fair share: while both read ({first_done:.1} s), prefetch 1 got {a} clips, prefetch 8 got {b} (ratio {:.2}); {:.1} s in all",
        b as f64 / a.max(1) as f64,
        fair_wall
    );
    report.insert("fair_overlap_seconds".into(), first_done.into());
    report.insert("fair_clips_prefetch1".into(), a.into());
    report.insert("fair_clips_prefetch8".into(), b.into());

    report.insert("threads".into(), args.threads.into());
    report.insert("gpus".into(), args.gpus.clone().into());
    report.insert(
        "one_stream_cpu_seconds_per_clip".into(),
        one_cpu_per_clip.into(),
    );
    report.insert(
        "two_ranks_cpu_seconds_per_clip".into(),
        two_cpu_per_clip.into(),
    );
    report.insert("corpus".into(), root.display().to_string().into());
    report.insert("one_stream".into(), serde_json::to_value(&one)?);
    report.insert("one_stream_clips_per_s".into(), one_rate.into());
    report.insert("two_ranks".into(), serde_json::to_value(&two)?);
    report.insert("two_ranks_clips_per_s".into(), two_rate.into());
    report.insert("two_over_one".into(), (two_rate / one_rate).into());
    report.insert("shared_decoded_over_delivered".into(), ratio.into());
    report.insert("one_stream_decoded_over_delivered".into(), one_ratio.into());
    report.insert("shared_over_one_job".into(), (ratio / one_ratio).into());
    report.insert(
        "shared_frames_decoded".into(),
        shared_stats.frames_decoded.into(),
    );
    report.insert("shared_frames_delivered".into(), delivered.into());
    report.insert("fair".into(), serde_json::to_value(&fair)?);
    let out = manifest.join("target/bench-results/streams.json");
    std::fs::create_dir_all(out.parent().expect("parent"))?;
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", out.display());
    Ok(())
}
