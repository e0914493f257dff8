//! Dataset health: every video of a dataset (or one shard of it) decoded whole with the daemon's own
//! FFmpeg code ([`crate::decode::ffmpeg::check_video`]), each result recorded in the [`Store`] with the
//! video's frame table, so the daemon that later serves the dataset re-indexes nothing and places no clip
//! where frames do not decode.
//!
//! Input: a [`Dataset`], its video list ([`videos`]), a [`Shard`], a job count and the store. Output: one
//! [`VideoReport`] per video, in completion order, to a callback; [`Summary`] totals them. Used by
//! `vserve check` (no daemon) and by the daemon's CheckDataset RPC.
//!
//! Invariants: a video's record is written only with a table that matches what decoding emits (a clean
//! file's packet-scan table, or the decode table of a damaged one, with `decode_table` set as the
//! catalogue sets it); a video that cannot be opened under the dataset (missing, outside it) gets a
//! report but no record, having no file identity; a video the store holds as quarantined (it crashed the
//! daemon) is reported as such and not opened.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use crate::dataset::{CheckedFile, Dataset};
use crate::decode::ffmpeg::{build_index_of, check_video};
use crate::manifest::Samples;
use crate::store::{Health, Key, Record, Store};

/// One video's verdict, as `vserve check` prints it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct VideoReport {
    /// Path relative to the dataset root.
    pub video: String,
    /// ok, damaged, unreadable or quarantined.
    pub status: String,
    /// Frames the decoder output.
    pub frames: u64,
    /// Frames a sampler may use (those before the first bad frame).
    pub decodable_frames: u64,
    pub first_bad_frame: Option<u64>,
    pub reason: Option<String>,
    /// Seconds of video (first frame's pts to the end of the last), 0 when unreadable.
    pub seconds: f64,
}

impl VideoReport {
    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }

    /// The report for a video whose record says `health` (with `seconds` of table).
    pub fn of(video: &str, health: &Health, seconds: f64) -> VideoReport {
        let (frames, first_bad, reason) = match health {
            Health::Unchecked => (0, None, None),
            Health::Ok { frames } => (*frames, None, None),
            Health::Damaged {
                frames,
                first_bad_frame,
                reason,
                ..
            } => (*frames, Some(*first_bad_frame), Some(reason.clone())),
            Health::Unreadable { reason, .. } | Health::Quarantined { reason } => {
                (0, None, Some(reason.clone()))
            }
        };
        VideoReport {
            video: video.to_owned(),
            status: health.status().to_owned(),
            frames,
            decodable_frames: health.decodable_frames(frames),
            first_bad_frame: first_bad,
            reason,
            seconds: if frames > 0 { seconds } else { 0.0 },
        }
    }
}

/// `I/N`: the videos whose path hashes to I modulo N. The N shards of a dataset partition it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// Parses `I/N` with 0 <= I < N.
    pub fn parse(s: &str) -> Result<Shard, String> {
        let bad = || format!("--shard {s:?}: expected I/N with 0 <= I < N");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (
            i.trim().parse::<u32>().map_err(|_| bad())?,
            n.trim().parse::<u32>().map_err(|_| bad())?,
        );
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// Whether `video` (a path relative to the dataset root) is in this shard: by a hash of the path, so
    /// a video stays in its shard when others are added or removed.
    pub fn contains(&self, video: &str) -> bool {
        crate::store::fnv1a(&[video.as_bytes()]) % self.count as u64 == self.index as u64
    }
}

/// The distinct videos of a dataset (its manifest's, else every video file under its root), sorted.
pub fn videos(ds: &Dataset, manifest: Option<&Path>) -> Result<Vec<String>, String> {
    let samples = match manifest {
        Some(m) => Samples::from_manifest(m).map_err(|e| e.to_string())?,
        None => Samples::scan(&ds.root)?,
    };
    let mut v: Vec<String> = samples.iter().map(|s| s.video.to_owned()).collect();
    v.sort();
    v.dedup();
    Ok(v)
}

/// `video` opened beneath the root (every later read goes through this descriptor, never the path
/// again) and its store key, or the report of a video that cannot be opened there.
fn open(ds: &Dataset, video: &str) -> Result<(CheckedFile, Key), VideoReport> {
    let file = ds.open(video).map_err(|e| {
        let health = Health::Unreadable {
            reason: e.to_string(),
            corrupt: false,
        };
        VideoReport::of(video, &health, 0.0)
    })?;
    let key = Key::of_file(&file, None);
    Ok((file, key))
}

/// Checks one video and records what was found. Blocking (decodes the whole video).
pub fn check_one(
    ds: &Dataset,
    video: &str,
    store: Option<&Store>,
) -> (VideoReport, Option<Record>) {
    let (file, key) = match open(ds, video) {
        Ok(x) => x,
        Err(unreadable) => return (unreadable, None),
    };
    // A file that crashed the daemon would crash this process too: not opened again while unchanged.
    if let Some(known) = store.and_then(|s| s.get_for(&file, &key)) {
        if matches!(known.health, Health::Quarantined { .. }) {
            return (VideoReport::of(video, &known.health, 0.0), Some(known));
        }
    }
    let record = examine(&file, key);
    if let Some(store) = store {
        if let Err(e) = store.put(&record) {
            tracing::warn!(video, error = %e, "cannot record the check in the store");
            UNSTORED.note(video, &e);
        }
    }
    let seconds = record.table.as_ref().map_or(0.0, |t| t.duration_seconds());
    (
        VideoReport::of(video, &record.health, seconds),
        Some(record),
    )
}

/// Decodes `file`'s stream whole: its health.
pub fn health_of(file: &CheckedFile, stream: Option<u32>) -> Health {
    match check_video(file, stream.map(|s| s as usize)) {
        Ok(c) if c.frames == 0 => Health::Unreadable {
            reason: "no decodable frames".into(),
            corrupt: true,
        },
        Ok(c) => match c.first_bad_frame {
            None => Health::Ok { frames: c.frames },
            Some(first) => Health::Damaged {
                frames: c.frames,
                first_bad_frame: first,
                bad_ranges: c.bad_ranges,
                reason: c.reason.unwrap_or_default(),
            },
        },
        Err(e) => Health::Unreadable {
            corrupt: matches!(e, crate::index::IndexError::Corrupt { .. }),
            reason: e.to_string(),
        },
    }
}

/// Decodes `file` whole and builds the table the daemon would serve it with.
pub fn examine(file: &CheckedFile, key: Key) -> Record {
    let health = health_of(file, key.stream);
    let content = file.content_sample();
    let frames = match &health {
        Health::Ok { frames } | Health::Damaged { frames, .. } => *frames,
        _ => {
            return Record {
                key,
                health,
                decode_table: false,
                table: None,
                written_ms: 0,
                content,
                node: file.node,
            }
        }
    };
    let stream = key.stream.map(|s| s as usize);
    let mut decode_table = matches!(health, Health::Damaged { .. });
    let mut table = build_index_of(file, stream, decode_table)
        .ok()
        .map(Arc::new);
    if !decode_table && table.as_ref().map(|t| t.frame_count() as u64) != Some(frames) {
        // The packet scan counted other frames than the decoder emits: serve the decode table.
        tracing::warn!(path = %file.path.display(), frames, "packet scan disagrees with decoding; keeping a decode table");
        decode_table = true;
        table = build_index_of(file, stream, true).ok().map(Arc::new);
    }
    Record {
        key,
        health,
        decode_table,
        table,
        written_ms: 0,
        content,
        node: file.node,
    }
}

/// Checks `videos` on `jobs` named threads, calling `report(result, done, total)` on the calling thread
/// as each finishes; stops early when it returns false.
pub fn run(
    ds: &Dataset,
    videos: &[String],
    jobs: usize,
    store: Option<&Store>,
    report: impl FnMut(VideoReport, Option<Record>, usize, usize) -> bool,
) {
    run_each(
        ds,
        videos,
        jobs,
        store,
        |d, v, s| Some(check_one(d, v, s)),
        report,
    )
}

/// Status of a video `vserve index` built a table for now.
pub const INDEXED: &str = "indexed";
/// Status of a video whose record the store already held for this version of the file.
pub const STORED: &str = "stored";
/// Status of a video `vserve index` built a table for that could not be written to the store (a full
/// or read-only state directory): the daemon would build it again.
pub const UNWRITTEN: &str = "unwritten";

/// Builds `video`'s frame table as the daemon's catalogue builds it (a packet scan, or a decode scan
/// for irregular files; a table that meets decoder errors also gets the whole-video health) and records
/// it, unless the store already holds a record of this version of the file with a table or a refusal
/// (status [`STORED`], nothing opened). Blocking.
pub fn index_one(
    ds: &Dataset,
    video: &str,
    store: Option<&Store>,
) -> (VideoReport, Option<Record>) {
    let (file, key) = match open(ds, video) {
        Ok(x) => x,
        Err(unreadable) => return (unreadable, None),
    };
    let report = |record: &Record, status: &str| {
        let table = record.table.as_deref();
        let frames = table.map_or(0, |t| t.frame_count() as u64);
        let seconds = table.map_or(0.0, |t| t.duration_seconds());
        let mut r = VideoReport::of(video, &record.health, seconds);
        if record.health.refusal().is_none() {
            r.status = status.to_owned();
            r.frames = frames;
            r.decodable_frames = record.health.decodable_frames(frames);
            r.seconds = seconds;
        }
        r
    };
    if let Some(known) = store.and_then(|s| s.get_for(&file, &key)) {
        if known.table.is_some() || known.health.refusal().is_some() {
            return (report(&known, STORED), Some(known));
        }
    }
    let built = build_index_of(&file, None, false);
    // A file over the pixel bound is one another configuration decodes: reported, not recorded.
    let remember = !matches!(built, Err(crate::index::IndexError::TooLarge { .. }));
    let (health, table) = match built {
        Ok(ix) if ix.needs_health_check() => (health_of(&file, None), Some(ix)),
        Ok(ix) => (Health::Unchecked, Some(ix)),
        Err(crate::index::IndexError::Corrupt { reason, .. }) => (
            Health::Unreadable {
                reason,
                corrupt: true,
            },
            None,
        ),
        Err(e) => (
            Health::Unreadable {
                reason: e.to_string(),
                corrupt: false,
            },
            None,
        ),
    };
    let record = Record {
        key,
        health,
        decode_table: false,
        table: table.map(|t| Arc::new(crate::store::format::pack(t))),
        written_ms: 0,
        content: file.content_sample(),
        node: file.node,
    };
    if let Some(store) = store.filter(|_| remember) {
        if let Err(e) = store.put(&record) {
            tracing::warn!(video, error = %e, "cannot record the table in the store");
            UNSTORED.note(video, &e);
            let mut r = report(&record, UNWRITTEN);
            if r.status == UNWRITTEN {
                r.reason = Some(format!("the table could not be written to the store: {e}"));
            }
            return (r, Some(record));
        }
    }
    (report(&record, INDEXED), Some(record))
}

/// Results this process could not write to the store (a read-only or full state directory, a
/// `--store-bytes` below one record): `vserve check` and `vserve index` fail with 74 when there are
/// any, since what they were run for was not kept.
pub static UNSTORED: Unstored = Unstored {
    count: std::sync::atomic::AtomicU64::new(0),
    first: parking_lot::Mutex::new(None),
};

pub struct Unstored {
    count: std::sync::atomic::AtomicU64,
    first: parking_lot::Mutex<Option<String>>,
}

impl Unstored {
    fn note(&self, video: &str, e: &std::io::Error) {
        self.count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.first
            .lock()
            .get_or_insert_with(|| format!("{video}: {e}"));
    }

    /// None when every result was stored; else a line saying how many were not, and the first.
    pub fn report(&self) -> Option<String> {
        let n = self.count.load(std::sync::atomic::Ordering::Relaxed);
        (n > 0).then(|| {
            format!(
                "{n} result(s) could not be written to the store (first: {})",
                self.first.lock().as_deref().unwrap_or("?")
            )
        })
    }
}

/// Runs `one` over `videos` on `jobs` named threads, calling `report(result, done, total)` on the
/// calling thread as each finishes; stops early when it returns false, and a thread stops when its
/// `one` returns None (the work is no longer wanted).
pub fn run_each(
    ds: &Dataset,
    videos: &[String],
    jobs: usize,
    store: Option<&Store>,
    one: impl Fn(&Dataset, &str, Option<&Store>) -> Option<(VideoReport, Option<Record>)> + Sync,
    mut report: impl FnMut(VideoReport, Option<Record>, usize, usize) -> bool,
) {
    let total = videos.len();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        for j in 0..jobs.clamp(1, total.max(1)) {
            let (tx, next, stop, one) = (tx.clone(), &next, &stop, &one);
            let spawned = std::thread::Builder::new()
                .name(format!("vserve-video-{j}"))
                .spawn_scoped(scope, move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if stop.load(Ordering::Relaxed) || i >= total {
                        break;
                    }
                    let Some(result) = one(ds, &videos[i], store) else {
                        break;
                    };
                    if tx.send(result).is_err() {
                        break;
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a check thread");
            }
        }
        drop(tx);
        for (done, (mut r, rec)) in rx.iter().enumerate() {
            // Named relative to the dataset, as the daemon's CheckDataset names them (the record keeps
            // the whole path; `vserve check` printed it: probe C).
            r.reason = r.reason.map(|m| ds.relative_message(&m));
            if !report(r, rec, done + 1, total) {
                stop.store(true, Ordering::Relaxed);
                break;
            }
        }
    });
}

/// Files and seconds of video by status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// (status, files, seconds), in the order ok, damaged, unreadable, quarantined.
    pub by_status: Vec<(String, u64, f64)>,
}

impl Summary {
    pub fn add(&mut self, r: &VideoReport) {
        if self.by_status.is_empty() {
            for s in ["ok", "damaged", "unreadable", "quarantined"] {
                self.by_status.push((s.to_owned(), 0, 0.0));
            }
        }
        if let Some(e) = self.by_status.iter_mut().find(|e| e.0 == r.status) {
            e.1 += 1;
            e.2 += r.seconds;
        } else {
            self.by_status.push((r.status.clone(), 1, r.seconds));
        }
    }

    pub fn files(&self) -> u64 {
        self.by_status.iter().map(|e| e.1).sum()
    }

    pub fn all_ok(&self) -> bool {
        self.by_status.iter().all(|e| e.0 == "ok" || e.1 == 0)
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut by = serde_json::Map::new();
        for (s, files, secs) in &self.by_status {
            by.insert(
                s.clone(),
                serde_json::json!({"files": files, "hours": secs / 3600.0}),
            );
        }
        let hours: f64 = self.by_status.iter().fold(0.0, |a, e| a + e.2) / 3600.0;
        serde_json::json!({"summary": {"files": self.files(), "hours": hours, "by_status": by}})
    }

    /// One line: `28 files, 0.07 h of video: 26 ok (0.06 h), 2 damaged (0.00 h), ...`.
    pub fn text(&self) -> String {
        let hours: f64 = self.by_status.iter().fold(0.0, |a, e| a + e.2) / 3600.0;
        let parts: Vec<String> = self
            .by_status
            .iter()
            .map(|(s, f, secs)| format!("{f} {s} ({:.2} h)", secs / 3600.0))
            .collect();
        if parts.is_empty() {
            return format!("{} files, {hours:.2} h of video", self.files());
        }
        format!(
            "{} files, {hours:.2} h of video: {}",
            self.files(),
            parts.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn media(rel: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/media")
            .join(rel)
    }

    /// The check reads the file it was given, as opened: the daemon checks the descriptor a request
    /// opened beneath the dataset root, whatever the path names by the time the check runs.
    #[test]
    fn a_check_reads_the_opened_file_not_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.mp4");
        std::fs::copy(media("decord/corrupted.mp4"), &path).unwrap();
        let file = CheckedFile::open_trusted(&path).unwrap();
        // The path now names a clean video; then nothing.
        let staged = dir.path().join("clean.mov");
        std::fs::copy(media("decord/video_0.mov"), &staged).unwrap();
        std::fs::rename(&staged, &path).unwrap();
        let damaged = |h: &Health| {
            matches!(
                h,
                Health::Damaged {
                    frames: 49,
                    first_bad_frame: 28,
                    ..
                }
            )
        };
        assert!(
            damaged(&health_of(&file, None)),
            "{:?}",
            health_of(&file, None)
        );
        std::fs::remove_file(&path).unwrap();
        let record = examine(&file, Key::of_file(&file, None));
        assert!(damaged(&record.health), "{:?}", record.health);
        assert!(record.decode_table);
        assert_eq!(record.table.map(|t| t.frame_count()), Some(49));
    }

    #[test]
    fn shards_partition_and_parse() {
        let videos: Vec<String> = (0..200)
            .map(|i| format!("class{}/v{i}.mp4", i % 7))
            .collect();
        let shards: Vec<Shard> = (0..3).map(|i| Shard { index: i, count: 3 }).collect();
        for v in &videos {
            assert_eq!(shards.iter().filter(|s| s.contains(v)).count(), 1, "{v}");
        }
        let sizes: Vec<usize> = shards
            .iter()
            .map(|s| videos.iter().filter(|v| s.contains(v)).count())
            .collect();
        assert!(sizes.iter().all(|&n| n > 40), "{sizes:?}");
        assert_eq!(Shard::parse("1/3"), Ok(Shard { index: 1, count: 3 }));
        for bad in ["3/3", "1", "a/2", "0/0", "-1/2"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        assert!(videos.iter().all(|v| Shard::ALL.contains(v)));
    }

    #[test]
    fn summary_counts_files_and_hours_by_status() {
        // Nothing checked: no negative zero (an empty float sum is -0.0).
        assert_eq!(Summary::default().text(), "0 files, 0.00 h of video");
        assert_eq!(
            Summary::default().to_json()["summary"]["hours"]
                .as_f64()
                .unwrap()
                .to_bits(),
            0.0f64.to_bits()
        );
        let mut s = Summary::default();
        let r = |status: &str, seconds: f64| VideoReport {
            video: "v".into(),
            status: status.into(),
            frames: 1,
            decodable_frames: 1,
            first_bad_frame: None,
            reason: None,
            seconds,
        };
        s.add(&r("ok", 1800.0));
        assert!(s.all_ok());
        s.add(&r("ok", 1800.0));
        s.add(&r("damaged", 360.0));
        assert!(!s.all_ok());
        assert_eq!(s.files(), 3);
        assert_eq!(
            s.text(),
            "3 files, 1.10 h of video: 2 ok (1.00 h), 1 damaged (0.10 h), 0 unreadable (0.00 h), 0 quarantined (0.00 h)"
        );
        assert_eq!(s.to_json()["summary"]["by_status"]["ok"]["files"], 2);
    }
}
