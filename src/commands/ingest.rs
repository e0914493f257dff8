//! `vserve ingest`: decode every video of a dataset once and store its frames as a GulpIO dataset.
//!
//! Input: a dataset directory (every video under it, sorted by path) or a manifest of it (rows in file
//! order, with labels and start/end trims), and [`IngestOptions`]. Output: chunks in the output directory
//! (see [`super::writer`]), `label2idx.json`, a progress line on stderr and a [`Summary`].
//!
//! Frames come from the daemon's own decode path: the video index ([`crate::decode::ffmpeg::build_index`]) and the FFmpeg
//! backend, with the same RGB conversion, rotation and bilinear resize (`--short-side`) as a GetClips
//! request, so stored frame k (before JPEG) equals what vserve serves for the source frame it came from.
//! Frame selection: frames whose pts lies in the sample's [start, end); with `--fps F`, the frame displayed
//! at each time t0 + j/F (t0 the first selected frame's time) while it stays in range.
//!
//! Video id: the sample's path (a path listed twice gets `#2`, `#3`, ...). `meta_data[0]` holds `path`,
//! `label`/`label_index` (when labelled), `start`/`end` (when trimmed), `fps` (of the stored frames),
//! `source_fps`, `frames`, `width`, `height`.
//!
//! Resumable: ids already in complete chunks are skipped, temporary files and data files without their
//! meta file (an interrupted run's) are removed, new chunks are numbered after the highest present.
//! Videos that fail are reported and left out; a rerun tries them again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::dataset::Dataset;
use crate::decode::ffmpeg::FfmpegBackend;
use crate::decode::{Backend, DecodeError, VideoSource};
use crate::gulp::jpeg::Encoder;
use crate::gulp::reader::{list_chunks, parse_meta};
use crate::gulp::writer::{write_atomic, ChunkWriter};
use crate::gulp::{data_name, meta_name};
use crate::manifest::{Sample, Samples};
use crate::request::{Resize, Transform};

mod settings;
use settings::settings_match;
pub use settings::SETTINGS_FILE;

#[derive(Clone, Debug)]
pub struct IngestOptions {
    pub dataset_dir: PathBuf,
    pub manifest: Option<PathBuf>,
    pub out: PathBuf,
    /// Output frame rate; None keeps every frame.
    pub fps: Option<f64>,
    /// Resize so the short side has this many pixels (bilinear, as GetClips' `short_side`).
    pub short_side: Option<u32>,
    /// JPEG quality, 1..=100.
    pub quality: u8,
    pub videos_per_chunk: usize,
    pub jobs: usize,
    /// Draw the progress line.
    pub progress: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{0}")]
    Usage(String),
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
}

#[derive(Debug, Default)]
pub struct Summary {
    pub videos: usize,
    pub skipped_existing: usize,
    pub frames: u64,
    pub bytes: u64,
    pub chunks: usize,
    /// (video path, reason), in sample order.
    pub failed: Vec<(String, String)>,
}

/// One video's stored result.
struct Encoded {
    id: String,
    meta: serde_json::Value,
    frames: Vec<Vec<u8>>,
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> IngestError + '_ {
    move |e| IngestError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// Ids for samples: the path, or `path#n` for its n-th listing.
fn sample_ids(samples: &[Sample<'_>]) -> Vec<String> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    samples
        .iter()
        .map(|s| {
            let n = seen.entry(s.video).or_insert(0);
            *n += 1;
            if *n == 1 {
                s.video.to_owned()
            } else {
                format!("{}#{}", s.video, n)
            }
        })
        .collect()
}

/// Ids in complete chunks, the highest chunk number, after removing what an interrupted run left.
fn prepare_out(out: &Path) -> Result<(BTreeSet<String>, Option<u64>), IngestError> {
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    for entry in std::fs::read_dir(out).map_err(io_err(out))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(".tmp") {
            std::fs::remove_file(entry.path()).map_err(io_err(&entry.path()))?;
        }
    }
    let list = list_chunks(out).map_err(io_err(out))?;
    if let Some(name) = list.misnamed.first() {
        return Err(IngestError::Usage(format!(
            "--out {}: {}; rename or remove it",
            out.display(),
            crate::gulp::reader::misnamed_reason(name)
        )));
    }
    let (datas, metas) = (list.data, list.meta);
    for k in &datas {
        if metas.binary_search(k).is_err() {
            let p = out.join(data_name(*k));
            tracing::info!(path = %p.display(), "removing a data file without its meta file (interrupted run)");
            std::fs::remove_file(&p).map_err(io_err(&p))?;
        }
    }
    let mut done = BTreeSet::new();
    for k in &metas {
        let p = out.join(meta_name(*k));
        let text = std::fs::read_to_string(&p).map_err(io_err(&p))?;
        let entries = parse_meta(&text).map_err(|reason| IngestError::Io {
            path: p.display().to_string(),
            reason: format!(
                "unreadable meta file ({reason}); check the directory with `vserve gulp-check`"
            ),
        })?;
        done.extend(entries.into_iter().map(|(id, _, _)| id));
    }
    Ok((done, metas.last().copied()))
}

/// Which source frames to store, in order (a frame may repeat when `fps` exceeds the source's).
fn select_frames(
    index: &crate::index::VideoIndex,
    sample: &Sample,
    fps: Option<f64>,
) -> Vec<usize> {
    let in_range = |k: usize| {
        let t = index.seconds(index.frames.at(k).pts);
        sample.start.is_none_or(|s| t >= s) && sample.end.is_none_or(|e| t < e)
    };
    let kept: Vec<usize> = (0..index.frame_count()).filter(|&k| in_range(k)).collect();
    let Some(fps) = fps else { return kept };
    let (Some(&first), Some(&last)) = (kept.first(), kept.last()) else {
        return kept;
    };
    let t0 = index.seconds(index.frames.at(first).pts);
    let last_end = index.seconds(index.frames.at(last).pts + index.frames.at(last).duration);
    let end = sample.end.map_or(last_end, |e| e.min(last_end));
    let mut out = Vec::new();
    for j in 0u64.. {
        let t = t0 + j as f64 / fps;
        if t >= end {
            break;
        }
        match index.lookup_time(t) {
            crate::index::Lookup::Frame(k) if in_range(k) => out.push(k),
            crate::index::Lookup::Frame(_) => {}
            _ => break,
        }
    }
    out
}

/// Decodes, resizes and encodes one sample's frames.
fn encode_video(
    dataset: &Dataset,
    sample: &Sample,
    id: &str,
    opts: &IngestOptions,
    backend: &mut FfmpegBackend,
    encoder: &mut Encoder,
) -> Result<Encoded, String> {
    // Opened as the daemon opens a client's path: beneath the root, no symlink out of it (a manifest
    // naming a link to a file outside had that file's frames stored, and then served).
    let file = Arc::new(dataset.open(sample.video).map_err(|e| e.to_string())?);
    let mut force_decode = false;
    loop {
        let index = Arc::new(
            crate::decode::ffmpeg::build_index_of(&file, None, force_decode)
                .map_err(|e| e.to_string())?,
        );
        let selected = select_frames(&index, sample, opts.fps);
        if selected.is_empty() {
            return Err("no frames in the sample's range".into());
        }
        let transform = Transform {
            resize: opts.short_side.map_or(Resize::Native, Resize::ShortSide),
            ..Transform::default()
        };
        let geometry = transform
            .geometry(&index, sample.video, &crate::config::Limits::default())
            .map_err(|e| e.to_string())?;
        let source = VideoSource {
            path: file.path.clone(),
            index: index.clone(),
            gulp: None,
            file: Some(file.clone()),
        };
        let wanted: BTreeSet<usize> = selected.iter().copied().collect();
        let mut encoded: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        let mut damaged = false;
        let (mut w, mut h) = (0, 0);
        // One thread decodes a sample's passes in turn: as few as possible.
        for run in crate::plan::gop_runs(&index, &wanted, 1) {
            match backend.decode_run(&source, &run, geometry, None) {
                Ok(out) => {
                    for (k, frame) in out.frames {
                        (w, h) = (frame.width, frame.height);
                        let jpeg = encoder
                            .encode(&frame.data, frame.width, frame.height)
                            .map_err(|e| format!("JPEG encoding failed: {e}"))?;
                        encoded.insert(k, jpeg);
                    }
                }
                Err(DecodeError::Damaged { .. }) if !force_decode => {
                    damaged = true;
                    break;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        if damaged {
            // As the daemon does: a file damaged inside its coded data is indexed by decoding.
            force_decode = true;
            continue;
        }
        let frames = selected
            .iter()
            .map(|k| {
                encoded
                    .get(k)
                    .cloned()
                    .ok_or_else(|| format!("frame {k} missing after decoding"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let out_fps = opts.fps.unwrap_or(index.avg_fps);
        let range = crate::gulp::FPS_RANGE;
        if !range.contains(&out_fps) {
            // A gulp reader ignores a rate outside the range (and serves the video at 25 fps).
            return Err(format!(
                "its frame rate {out_fps} is outside {}..={}, what a gulp dataset may store; give --fps",
                range.start(),
                range.end()
            ));
        }
        let mut meta = serde_json::json!({
            "path": sample.video,
            "fps": out_fps,
            "source_fps": index.avg_fps,
            "frames": frames.len(),
            "width": w,
            "height": h,
        });
        if let Some(l) = &sample.label {
            meta["label"] = serde_json::Value::String((*l).to_owned());
            meta["label_index"] = serde_json::Value::from(sample.label_index);
        }
        if let Some(s) = sample.start {
            meta["start"] = serde_json::Value::from(s);
        }
        if let Some(e) = sample.end {
            meta["end"] = serde_json::Value::from(e);
        }
        return Ok(Encoded {
            id: id.to_owned(),
            meta,
            frames,
        });
    }
}

/// Draws the progress line: videos, frames/s, ETA.
struct Progress {
    enabled: bool,
    tty: bool,
    started: Instant,
    last: Instant,
    total: usize,
}

impl Progress {
    fn draw(&mut self, done: usize, frames: u64, failed: usize, last: bool) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        let every = if self.tty {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(5)
        };
        if !last && now.duration_since(self.last) < every {
            return;
        }
        self.last = now;
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let eta = if done > 0 && done < self.total {
            let left = secs / done as f64 * (self.total - done) as f64;
            format!("{}m{:02}s", left as u64 / 60, left as u64 % 60)
        } else {
            "-".into()
        };
        let width = 30;
        let filled = (done * width).checked_div(self.total).unwrap_or(width);
        let line = format!(
            "ingest [{}{}] {done}/{} videos, {frames} frames, {:.0} frames/s, ETA {eta}{}",
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.total,
            frames as f64 / secs,
            if failed > 0 {
                format!(", {failed} failed")
            } else {
                String::new()
            }
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r{line}\x1b[K");
            if last {
                let _ = writeln!(err);
            }
        } else {
            let _ = writeln!(err, "{line}");
        }
    }
}

/// Runs an ingest. Failed videos are listed in the summary (the run itself still succeeds).
pub fn run(opts: &IngestOptions) -> Result<Summary, IngestError> {
    if opts.videos_per_chunk == 0 {
        return Err(IngestError::Usage(
            "--videos-per-chunk must be at least 1".into(),
        ));
    }
    if opts.jobs == 0 {
        return Err(IngestError::Usage("--jobs must be at least 1".into()));
    }
    if !(1..=100).contains(&opts.quality) {
        return Err(IngestError::Usage(format!(
            "--quality {} is outside 1..=100",
            opts.quality
        )));
    }
    if let Some(f) = opts.fps {
        let range = crate::gulp::FPS_RANGE;
        if !range.contains(&f) {
            return Err(IngestError::Usage(format!(
                "--fps {f} is outside {}..={} (frames a second a gulp dataset may store)",
                range.start(),
                range.end()
            )));
        }
    }
    if opts.short_side == Some(0) {
        return Err(IngestError::Usage("--short-side must be at least 1".into()));
    }
    let dataset_dir = opts
        .dataset_dir
        .canonicalize()
        .map_err(io_err(&opts.dataset_dir))?;
    if opts.out.canonicalize().is_ok_and(|out| out == dataset_dir) {
        // Chunks beside the videos make the directory a gulp dataset: its videos would no longer be served.
        return Err(IngestError::Usage(format!(
            "--out {} is the dataset directory itself; write the gulp dataset to a directory of its own",
            opts.out.display()
        )));
    }
    let dataset =
        Arc::new(Dataset::new("ingest", &dataset_dir).map_err(io_err(&opts.dataset_dir))?);
    let samples = match &opts.manifest {
        Some(m) => Samples::from_manifest(m).map_err(|e| IngestError::Usage(e.to_string()))?,
        None => Samples::scan(&dataset_dir).map_err(IngestError::Usage)?,
    };
    if let Some(w) = samples.warning() {
        tracing::warn!("{w}");
    }
    if let Some(why) = samples.negative_label() {
        return Err(IngestError::Usage(why)); // label2idx.json would hold it, and readers refuse it
    }
    let ids = sample_ids(&samples.iter().collect::<Vec<_>>());
    let (done, last_chunk) = prepare_out(&opts.out)?;
    settings_match(&opts.out, opts, last_chunk.is_some())?;

    // label2idx.json: every label of the sample list (the same on every run).
    let labels: BTreeMap<&str, i64> = samples
        .iter()
        .filter_map(|s| s.label.map(|l| (l, s.label_index)))
        .collect();
    if !labels.is_empty() {
        let text = serde_json::to_string(&labels).unwrap_or_default();
        write_atomic(&opts.out, "label2idx.json", text.as_bytes()).map_err(io_err(&opts.out))?;
    }

    let todo: Vec<usize> = (0..samples.len())
        .filter(|&i| !done.contains(&ids[i]))
        .collect();
    let mut summary = Summary {
        skipped_existing: samples.len() - todo.len(),
        ..Summary::default()
    };
    if todo.is_empty() {
        return Ok(summary);
    }
    let jobs = opts.jobs.max(1).min(todo.len());
    let next = Arc::new(AtomicUsize::new(0));
    let todo = Arc::new(todo);
    let samples = Arc::new(samples);
    let ids = Arc::new(ids);
    let (tx, rx) = mpsc::sync_channel::<(usize, Result<Encoded, String>)>(jobs * 2);
    let mut workers = Vec::with_capacity(jobs);
    for w in 0..jobs {
        let (next, todo, samples, ids, tx, opts, dir) = (
            next.clone(),
            todo.clone(),
            samples.clone(),
            ids.clone(),
            tx.clone(),
            opts.clone(),
            dataset.clone(),
        );
        let handle = std::thread::Builder::new()
            .name(format!("vserve-ingest-{w}"))
            .spawn(move || {
                let mut backend = FfmpegBackend::new(1);
                let mut encoder = match Encoder::new(opts.quality) {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = tx.send((usize::MAX, Err(e.to_string())));
                        return;
                    }
                };
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&s) = todo.get(i) else { break };
                    let sample = &samples.get(s);
                    let result =
                        encode_video(&dir, sample, &ids[s], &opts, &mut backend, &mut encoder);
                    if tx.send((s, result)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| IngestError::Io {
                path: "ingest threads".into(),
                reason: e.to_string(),
            })?;
        workers.push(handle);
    }
    drop(tx);

    let mut progress = Progress {
        enabled: opts.progress,
        tty: std::io::stderr().is_terminal(),
        started: Instant::now(),
        last: Instant::now() - Duration::from_secs(60),
        total: todo.len(),
    };
    let mut chunk_no = last_chunk.map_or(0, |k| k + 1);
    let mut chunk: Option<ChunkWriter> = None;
    let mut finished = 0usize;
    let mut failed: Vec<(usize, String)> = Vec::new();
    let mut write_error = None;
    for (s, result) in rx {
        finished += 1;
        match result {
            // s is usize::MAX when a worker could not start (reported as "(all)").
            Err(reason) => failed.push((s, reason)),
            Ok(enc) => {
                let step = (|| -> std::io::Result<()> {
                    if chunk.is_none() {
                        chunk = Some(ChunkWriter::create(&opts.out, chunk_no)?);
                        chunk_no += 1;
                    }
                    if let Some(c) = chunk.as_mut() {
                        c.append(&enc.id, &enc.meta, &enc.frames)?;
                        if c.videos() >= opts.videos_per_chunk {
                            if let Some(c) = chunk.take() {
                                c.finish()?;
                                summary.chunks += 1;
                            }
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = step {
                    write_error = Some(IngestError::Io {
                        path: opts.out.display().to_string(),
                        reason: e.to_string(),
                    });
                    break;
                }
                summary.videos += 1;
                summary.frames += enc.frames.len() as u64;
                summary.bytes += enc.frames.iter().map(|f| f.len() as u64).sum::<u64>();
            }
        }
        progress.draw(finished, summary.frames, failed.len(), false);
    }
    if let Some(e) = write_error {
        if let Some(c) = chunk.take() {
            c.discard();
        }
        // Workers stop at their next send (the receiver is gone).
        return Err(e);
    }
    if let Some(c) = chunk.take() {
        c.finish().map_err(io_err(&opts.out))?;
        summary.chunks += 1;
    }
    for w in workers {
        let _ = w.join();
    }
    progress.draw(finished, summary.frames, failed.len(), true);
    failed.sort();
    summary.failed = failed
        .into_iter()
        .map(|(s, reason)| {
            let video = if s < samples.len() {
                samples.video(s).to_owned()
            } else {
                "(all)".to_owned()
            };
            (video, reason)
        })
        .collect();
    Ok(summary)
}

/// `vserve ingest`: exit 0 when every video was stored, 1 when some failed (listed), 64 on bad flags,
/// 74 on an output error.
pub fn ingest(args: &crate::cli::IngestArgs) -> std::process::ExitCode {
    let opts = IngestOptions {
        dataset_dir: args.dataset_dir.clone(),
        manifest: args.manifest.clone(),
        out: args.out.clone(),
        fps: args.fps,
        short_side: args.short_side,
        quality: args.quality,
        videos_per_chunk: args.videos_per_chunk,
        jobs: args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        progress: !args.quiet,
    };
    match run(&opts) {
        Ok(s) => {
            eprintln!(
                "ingest: {} videos stored ({} frames, {} bytes of JPEG) in {} new chunks; {} already present; {} failed",
                s.videos,
                s.frames,
                s.bytes,
                s.chunks,
                s.skipped_existing,
                s.failed.len()
            );
            for (video, reason) in &s.failed {
                eprintln!("ingest: failed: {video:?}: {reason}");
            }
            if s.failed.is_empty() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(1)
            }
        }
        Err(e @ IngestError::Usage(_)) => {
            eprintln!("vserve ingest: {e}");
            std::process::ExitCode::from(64)
        }
        Err(e) => {
            eprintln!("vserve ingest: {e}");
            std::process::ExitCode::from(74)
        }
    }
}

/// `vserve gulp-check DIR`: prints the report; exit 0 when clean, 1 on problems, 74 when unreadable.
pub fn gulp_check(args: &crate::cli::GulpCheckArgs) -> std::process::ExitCode {
    let side = u64::from(args.max_side);
    match crate::gulp::check::check(&args.dir, side * side) {
        Ok(r) => {
            for w in &r.warnings {
                println!("warning: {w}");
            }
            for p in &r.problems {
                println!("problem: {p}");
            }
            if r.ok() {
                println!(
                    "ok: {} chunks, {} videos, {} frames",
                    r.chunks, r.videos, r.frames
                );
                std::process::ExitCode::SUCCESS
            } else {
                println!(
                    "FAILED: {} problems in {} chunks, {} videos, {} frames",
                    r.problems.len(),
                    r.chunks,
                    r.videos,
                    r.frames
                );
                std::process::ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("vserve gulp-check: cannot read {}: {e}", args.dir.display());
            std::process::ExitCode::from(74)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::VideoIndex;

    fn index(n: usize, fps: i32) -> VideoIndex {
        VideoIndex {
            width: 4,
            height: 4,
            ..crate::index::uniform(n, &[0], fps)
        }
    }

    fn sample(start: Option<f64>, end: Option<f64>) -> Sample<'static> {
        Sample {
            video: "v.mp4",
            label: None,
            label_index: -1,
            start,
            end,
        }
    }

    #[test]
    fn frames_are_selected_by_trim_and_rate() {
        let ix = index(30, 10); // 3 s at 10 fps
        assert_eq!(select_frames(&ix, &sample(None, None), None).len(), 30);
        assert_eq!(
            select_frames(&ix, &sample(Some(1.0), Some(1.5)), None),
            vec![10, 11, 12, 13, 14]
        );
        assert_eq!(
            select_frames(&ix, &sample(None, None), Some(2.0)),
            vec![0, 5, 10, 15, 20, 25]
        );
        assert_eq!(
            select_frames(&ix, &sample(Some(1.0), Some(1.3)), Some(20.0)),
            vec![10, 10, 11, 11, 12, 12]
        );
        let ids = sample_ids(&[sample(None, None), sample(Some(1.0), None)]);
        assert_eq!(ids, vec!["v.mp4", "v.mp4#2"]);
    }
}
