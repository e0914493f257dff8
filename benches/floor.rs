//! `floor`: FFmpeg's own decode time for an explicit list of GOP runs (the floor of DESIGN.md's reference
//! workloads), for drivers that choose the runs themselves (`benches/reference.py`).
//!
//! ```text
//! cargo bench --bench floor -- PLAN.json [--threads N] [--modes specified,tight]
//! ```
//!
//! PLAN.json:
//!
//! ```json
//! {"root": "/abs/dir",
//!  "videos": [{"rel": "a.mp4", "stream": 0, "time_base": [1, 12800], "pts": [0, 512, ...]}],
//!  "runs": [{"video": 0, "keyframe": 0, "wanted": [[0, 3], [1, 7]], "out_size": [340, 256]}]}
//! ```
//!
//! `wanted` holds (output slot, frame index) pairs, ascending by frame, all in the GOP that starts at
//! `keyframe` (or from frame 0 onwards, for a run that reads through several GOPs on purpose, such as
//! a whole video). Each mode of `benches/common/floor.rs` runs once on `--threads` threads; the output is
//! one JSON object on stdout: per mode the wall seconds, frames decoded, frames converted, restarts and the
//! process's CPU seconds during the pass.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context as _, Result};
use ffmpeg_next as ffmpeg;
use serde_json::{json, Value};

#[path = "common/floor.rs"]
#[allow(dead_code)] // parts only benches/uniform.rs uses
mod floor;
use floor::{floor_pass, FloorMode, FloorVideo, Run};

fn main() {
    if let Err(e) = run() {
        eprintln!("floor: {e:#}");
        std::process::exit(1);
    }
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF counts every thread of this process.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn run() -> Result<()> {
    let mut plan_path: Option<PathBuf> = None;
    let mut threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut modes = FloorMode::ALL.to_vec();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--threads" => {
                threads = args
                    .next()
                    .ok_or_else(|| anyhow!("--threads needs a value"))?
                    .parse()
                    .context("--threads")?
            }
            "--modes" => {
                let v = args
                    .next()
                    .ok_or_else(|| anyhow!("--modes needs a value"))?;
                modes = v
                    .split(',')
                    .map(|m| match m {
                        "specified" => Ok(FloorMode::AS_SPECIFIED),
                        "tight" => Ok(FloorMode::TIGHT),
                        other => Err(anyhow!("unknown mode {other:?} (specified, tight)")),
                    })
                    .collect::<Result<_>>()?;
            }
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            p if !p.starts_with('-') => plan_path = Some(PathBuf::from(p)),
            other => bail!("unknown argument {other:?}"),
        }
    }
    let plan_path = plan_path.ok_or_else(|| anyhow!("usage: floor PLAN.json [--threads N]"))?;
    let plan: Value = serde_json::from_slice(
        &std::fs::read(&plan_path).with_context(|| format!("reading {}", plan_path.display()))?,
    )
    .context("parsing the plan")?;
    let root = PathBuf::from(
        plan["root"]
            .as_str()
            .ok_or_else(|| anyhow!("plan.root missing"))?,
    );
    let as_u64 = |v: &Value, what: &str| v.as_u64().ok_or_else(|| anyhow!("{what}: not a number"));
    let mut videos = Vec::new();
    for v in plan["videos"]
        .as_array()
        .ok_or_else(|| anyhow!("plan.videos missing"))?
    {
        let tb = v["time_base"]
            .as_array()
            .ok_or_else(|| anyhow!("time_base"))?;
        videos.push(FloorVideo {
            rel: PathBuf::from(v["rel"].as_str().ok_or_else(|| anyhow!("video.rel"))?),
            stream: as_u64(&v["stream"], "stream")? as usize,
            time_base: (
                as_u64(&tb[0], "time_base")? as i32,
                as_u64(&tb[1], "time_base")? as i32,
            ),
            pts: v["pts"]
                .as_array()
                .ok_or_else(|| anyhow!("video.pts"))?
                .iter()
                .map(|p| p.as_i64().ok_or_else(|| anyhow!("pts: not an integer")))
                .collect::<Result<_>>()?,
            slots: 0,
        });
    }
    let mut runs = Vec::new();
    let mut frames_out = 0u64;
    for r in plan["runs"]
        .as_array()
        .ok_or_else(|| anyhow!("plan.runs missing"))?
    {
        let video = as_u64(&r["video"], "run.video")? as usize;
        let v = videos
            .get_mut(video)
            .ok_or_else(|| anyhow!("run.video {video} out of range"))?;
        let mut wanted = Vec::new();
        for w in r["wanted"]
            .as_array()
            .ok_or_else(|| anyhow!("run.wanted"))?
        {
            let slot = as_u64(&w[0], "slot")? as usize;
            let frame = as_u64(&w[1], "frame")?;
            if frame as usize >= v.pts.len() {
                bail!("frame {frame} of {} is past its table", v.rel.display());
            }
            v.slots = v.slots.max(slot + 1);
            wanted.push((slot, frame));
        }
        frames_out += wanted.len() as u64;
        let size = r["out_size"]
            .as_array()
            .ok_or_else(|| anyhow!("out_size"))?;
        runs.push(Run {
            video,
            keyframe: as_u64(&r["keyframe"], "keyframe")?,
            wanted,
            out_size: (
                as_u64(&size[0], "out_size")? as u32,
                as_u64(&size[1], "out_size")? as u32,
            ),
        });
    }
    ffmpeg::init().context("ffmpeg init")?;
    ffmpeg::util::log::set_level(ffmpeg::util::log::Level::Error);
    let mut passes = Vec::new();
    for mode in modes {
        let cpu0 = cpu_seconds();
        let pass = floor_pass(&root, &videos, &runs, threads, mode)?;
        passes.push(json!({
            "mode": mode.name(),
            "seconds": pass.seconds,
            "frames_decoded": pass.frames_decoded,
            "frames_out": frames_out,
            "runs": runs.len(),
            "restarts": pass.restarts,
            "cpu_seconds": cpu_seconds() - cpu0,
        }));
    }
    println!("{}", json!({"threads": threads, "passes": passes}));
    Ok(())
}
