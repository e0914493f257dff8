//! The persistent store: what the daemon (and `vserve check`) learned about each video, kept in the state
//! directory so that a restart re-indexes nothing that is unchanged and a damaged file stays known.
//!
//! Input: a [`Key`] (the file's canonical path, size, mtime and the stream asked for: the catalogue's
//! identity) and a [`Record`] (the frame table, if any, and the video's [`Health`]). Output: the record
//! again, after a restart, from any process sharing the directory.
//!
//! Layout: one file per (video, stream) at `store/HH/HHHHHHHHHHHHHHHH.vidx` in the state directory, named
//! by a 64-bit FNV-1a hash of the path and stream (`HH` its first byte: 256 subdirectories keep a million
//! videos at ~4000 entries per directory). One file per video, not one per dataset shard, because the
//! daemon and `vserve check` write concurrently and independently: each record is replaced on its own by an
//! atomic rename ([`StateDir::write_atomic`]) with no lock and no read-modify-write of a shared file, a torn
//! or corrupt file costs one video, and eviction deletes whole files. The format ([`format`]) is a fixed
//! header plus fixed-width columns, so a later reader can memory-map a record and read frame k directly.
//!
//! Invariants: a record is trusted only after its magic, version, checksum, length, offsets and its
//! identity (path, size, mtime, stream) all check out; anything else is ignored with a warning (a
//! changed file's stale record silently) and replaced on the next write. The directory's size stays under
//! `max_bytes`: when a write takes it over, the least recently used records (file mtime, refreshed when a
//! record is read) are deleted down to 90 %. Deleting the whole directory, or any file in it, at any time
//! is safe: the next lookup misses and the video is indexed again.

pub mod format;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::index::table::TableBytes;
use crate::index::VideoIndex;
use crate::state::StateDir;

/// The store's directory inside the state directory.
pub const DIR: &str = "store";
/// Default bound on the store's size.
pub const DEFAULT_MAX_BYTES: u64 = crate::config::DEFAULT_STORE_BYTES;

/// One stream of one version of one file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// Canonical path.
    pub path: PathBuf,
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// The container stream asked for; None = FFmpeg's best video stream.
    pub stream: Option<u32>,
}

impl Key {
    /// The identity of `path` as `meta` describes it.
    pub fn new(path: &Path, meta: &std::fs::Metadata, stream: Option<u32>) -> Key {
        Key {
            path: path.to_owned(),
            size: meta.len(),
            mtime_ns: crate::dataset::mtime_ns(meta),
            stream,
        }
    }

    /// The identity of a file opened and checked (what its descriptor's `fstat` said).
    pub fn of_file(file: &crate::dataset::CheckedFile, stream: Option<u32>) -> Key {
        Key {
            path: file.path.clone(),
            size: file.size,
            mtime_ns: file.mtime_ns,
            stream,
        }
    }
}

/// What is known about a video's decodability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Indexed, never decoded whole: nothing known against it.
    Unchecked,
    /// Decoded whole with no error reported.
    Ok { frames: u64 },
    /// Decoded whole; errors from `first_bad_frame` on (frames before it decoded cleanly).
    Damaged {
        /// Frames the decoder output, damaged ones included.
        frames: u64,
        first_bad_frame: u64,
        /// `[start, end)` ranges of frames flagged damaged or where errors were charged.
        bad_ranges: Vec<(u64, u64)>,
        reason: String,
    },
    /// Cannot be indexed or decoded at all: `corrupt` for damaged media (no decodable frame, corrupt
    /// headers), else not media FFmpeg reads (not a video, no video stream, unsupported codec).
    Unreadable { reason: String, corrupt: bool },
    /// Crashed the daemon (the poison-file journal's verdict): never opened again while unchanged.
    Quarantined { reason: String },
}

impl Health {
    /// The name `vserve check` prints: unchecked, ok, damaged, unreadable, quarantined.
    pub fn status(&self) -> &'static str {
        match self {
            Health::Unchecked => "unchecked",
            Health::Ok { .. } => "ok",
            Health::Damaged { .. } => "damaged",
            Health::Unreadable { .. } => "unreadable",
            Health::Quarantined { .. } => "quarantined",
        }
    }

    /// Frames a sampler may place clips in, of a table of `frames`: those before the first bad frame.
    pub fn decodable_frames(&self, frames: u64) -> u64 {
        match self {
            Health::Unchecked | Health::Ok { .. } => frames,
            Health::Damaged {
                first_bad_frame, ..
            } => frames.min(*first_bad_frame),
            Health::Unreadable { .. } | Health::Quarantined { .. } => 0,
        }
    }

    /// Why the video must not be opened, for unreadable and quarantined videos.
    pub fn refusal(&self) -> Option<&str> {
        match self {
            Health::Unreadable { reason, .. } | Health::Quarantined { reason } => Some(reason),
            _ => None,
        }
    }
}

/// What the store holds for one key.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub key: Key,
    pub health: Health,
    /// The table was built by decoding because the file is damaged (the catalogue's `decode_table`).
    pub decode_table: bool,
    pub table: Option<Arc<VideoIndex>>,
    /// When written, ms since the epoch (set by [`Store::put`]).
    pub written_ms: u64,
    /// The file's [`CheckedFile::content_sample`](crate::dataset::CheckedFile::content_sample) when the
    /// record was made; 0 when unknown (records of format versions 1 and 2, which are trusted on path,
    /// size and mtime alone).
    pub content: u64,
    /// The file node (device, inode, status-change time) the record was made from; all 0 when unknown
    /// (format versions 1 to 3). A damaged or unreadable verdict holds only for it ([`Record::made_from`]).
    pub node: crate::dataset::FileNode,
}

impl Record {
    /// Whether this record may describe `file`, whose path, size and mtime it has: false (logged) when
    /// its content sample says another file, of the same size and mtime, took the path since; true when
    /// the record has none (format versions 1 and 2) or the file cannot be read.
    ///
    /// A record saying the file is damaged or unreadable holds only for the file node it was made from:
    /// a repaired copy renamed over a file damaged in its middle has its size, mtime and content sample,
    /// and was refused as DATA_LOSS for good. Such a file is checked again (a rebuild that costs a few
    /// damaged files a decode after a dataset is copied elsewhere). Tables of sound files are trusted
    /// across copies, on their content sample.
    pub fn made_from(&self, file: &crate::dataset::CheckedFile) -> bool {
        let verdict = matches!(
            self.health,
            Health::Damaged { .. } | Health::Unreadable { .. }
        );
        if verdict && self.node != crate::dataset::FileNode::default() && self.node != file.node {
            tracing::info!(video = %self.key.path.display(), status = self.health.status(), "the stored verdict was made from another file node (replaced or rewritten since); checked again");
            return false;
        }
        if self.content == 0 {
            return true;
        }
        let now = file.content_sample();
        let same = now == 0 || now == self.content;
        if !same {
            tracing::info!(video = %self.key.path.display(), "the stored record was made from another file of the same size and mtime (replaced); not used");
        }
        same
    }
}

/// The store in one state directory.
pub struct Store {
    state: StateDir,
    max_bytes: u64,
    /// Bytes of records, once counted (the first write walks the directory).
    used: Mutex<Option<u64>>,
}

/// Records at least this long are memory-mapped, smaller ones read onto the heap: a map costs a page
/// of address space and a kernel mapping however small the file, more than a short record's bytes.
pub const MAP_AT: u64 = 16 << 10;

/// What `--store-bytes` counts a record file as: its length in whole 4 KiB blocks, what a small file
/// takes on disk (a 350-byte record takes a block), not its length.
pub fn on_disk(len: u64) -> u64 {
    len.div_ceil(4096) * 4096
}

/// A record file's bytes: mapped read-only when long, else read. None when there is no such file.
fn read_record(path: &Path) -> io::Result<Option<TableBytes>> {
    let (file, meta) =
        match crate::state::open_regular(std::fs::OpenOptions::new().read(true), path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
    let len = meta.len();
    if len >= MAP_AT {
        // SAFETY: the map is read-only and outlives no borrow of it. vserve never writes or truncates a
        // record file in place (writes go to a temporary file renamed over the old name; eviction deletes
        // whole files), so the mapped inode's contents do not change while it is mapped. Another program
        // truncating the file in place (e.g. `cp` over it) would make reads fault (SIGBUS): the README
        // says to merge stores by renaming copies (`rsync`, `cp` to a new tree), not overwriting in place.
        let map = unsafe { memmap2::Mmap::map(&file) };
        match map {
            Ok(m) => return Ok(Some(TableBytes::Mapped(m))),
            // Out of mappings (vm.max_map_count) or address space: read it instead.
            Err(e) => {
                tracing::debug!(file = %path.display(), error = %e, "cannot map a store record; reading it")
            }
        }
    }
    let mut bytes = Vec::with_capacity(len as usize);
    io::Read::read_to_end(&mut &file, &mut bytes)?;
    Ok(Some(TableBytes::Heap(bytes.into_boxed_slice())))
}

/// 64-bit FNV-1a: stable across builds and platforms (names files, picks shards).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Store {
    /// The store inside `state`, bounded to `max_bytes`. Creates nothing until the first write.
    pub fn open(state: &StateDir, max_bytes: u64) -> Store {
        Store {
            state: state.clone(),
            max_bytes,
            used: Mutex::new(None),
        }
    }

    /// The file holding `key`'s record, relative to the state directory.
    pub fn file_name(key: &Key) -> String {
        let stream = key
            .stream
            .map_or_else(|| "best".to_owned(), |s| s.to_string());
        let h = fnv1a(&[
            key.path.as_os_str().as_encoded_bytes(),
            b"\0",
            stream.as_bytes(),
        ]);
        format!("{DIR}/{:02x}/{h:016x}.vidx", h >> 56)
    }

    /// The file holding `key`'s record.
    pub fn path_of(&self, key: &Key) -> PathBuf {
        self.state.path(&Store::file_name(key))
    }

    /// `key`'s record, if one is stored and trusted. Corrupt, foreign or other-version files are ignored
    /// with a warning; a record of an earlier version of the file (other size or mtime) is ignored quietly.
    pub fn get(&self, key: &Key) -> Option<Record> {
        let name = Store::file_name(key);
        let bytes = match read_record(&self.state.path(&name)) {
            Ok(Some(b)) => b,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(file = %self.state.path(&name).display(), error = %e, "store record unreadable; ignoring it");
                return None;
            }
        };
        let record = match format::decode_owned(bytes) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(file = %self.state.path(&name).display(), video = %key.path.display(), error = %e, "store record not trusted; ignoring it");
                return None;
            }
        };
        if record.key.path != key.path || record.key.stream != key.stream {
            tracing::warn!(file = %self.state.path(&name).display(), video = %key.path.display(), holds = %record.key.path.display(), "store record belongs to another video; ignoring it");
            return None;
        }
        if record.key != *key {
            tracing::debug!(video = %key.path.display(), "store record is of an earlier version of the file");
            return None;
        }
        // Recently used: evicted last.
        let _ = std::fs::File::options()
            .write(true)
            .open(self.state.path(&name))
            .and_then(|f| f.set_modified(SystemTime::now()));
        Some(record)
    }

    /// [`Store::get`] for the file `file` is now: a record made from another file that took this one's
    /// path with the same size and mtime (its content sample differs) is ignored, with a log line, and is
    /// replaced by the caller's next `put`.
    pub fn get_for(&self, file: &crate::dataset::CheckedFile, key: &Key) -> Option<Record> {
        self.get(key).filter(|r| r.made_from(file))
    }

    /// Stores `record` (replacing any record of its key), then evicts if the store grew past its bound.
    pub fn put(&self, record: &Record) -> io::Result<()> {
        let mut record = record.clone();
        record.written_ms = now_ms();
        let bytes = format::encode(&record);
        let size = on_disk(bytes.len() as u64);
        if size > self.max_bytes {
            return Err(io::Error::other(format!(
                "a record of {} bytes ({size} on disk) does not fit the store's {} bytes",
                bytes.len(),
                self.max_bytes
            )));
        }
        let name = Store::file_name(&record.key);
        let old = std::fs::metadata(self.state.path(&name)).map_or(0, |m| on_disk(m.len()));
        self.state.write_atomic(&name, &bytes)?;
        let over = {
            let mut used = self.used.lock();
            let total = match *used {
                Some(u) => u.saturating_sub(old) + size,
                None => self.walk().iter().map(|f| f.1).sum(),
            };
            *used = Some(total);
            total > self.max_bytes
        };
        if over {
            self.evict();
        }
        Ok(())
    }

    /// Replaces `key`'s health, keeping its table (the poison-file journal records quarantines here).
    pub fn set_health(&self, key: &Key, health: Health) -> io::Result<()> {
        let mut record = self.get(key).unwrap_or(Record {
            key: key.clone(),
            health: Health::Unchecked,
            decode_table: false,
            table: None,
            written_ms: 0,
            content: 0,
            node: crate::dataset::FileNode::default(),
        });
        record.health = health;
        self.put(&record)
    }

    /// Bytes the store's files take now, in whole blocks ([`on_disk`]).
    pub fn bytes_used(&self) -> u64 {
        self.walk().iter().map(|f| f.1).sum()
    }

    /// Every record file: (mtime, bytes on disk, path).
    fn walk(&self) -> Vec<(SystemTime, u64, PathBuf)> {
        let mut out = Vec::new();
        let Ok(dirs) = std::fs::read_dir(self.state.path(DIR)) else {
            return out;
        };
        for d in dirs.flatten() {
            let Ok(files) = std::fs::read_dir(d.path()) else {
                continue;
            };
            for f in files.flatten() {
                let p = f.path();
                let Ok(m) = f.metadata() else { continue };
                let modified = m.modified().unwrap_or(UNIX_EPOCH);
                if p.extension().is_some_and(|e| e == "vidx") {
                    out.push((modified, on_disk(m.len()), p));
                } else if f.file_name().to_string_lossy().contains(".tmp-")
                    && modified.elapsed().is_ok_and(|age| age.as_secs() > 3600)
                {
                    // A temp file of a writer that died before its rename.
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        out
    }

    /// Deletes the least recently used records until the store holds at most 90 % of its bound.
    fn evict(&self) {
        let mut files = self.walk();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        let target = self.max_bytes / 10 * 9;
        files.sort();
        let mut removed = 0usize;
        for (_, len, path) in files {
            if total <= target {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total = total.saturating_sub(len);
                removed += 1;
            }
        }
        *self.used.lock() = Some(total);
        tracing::debug!(
            removed,
            bytes = total,
            max = self.max_bytes,
            "store evicted its least recently used records"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{FrameEntry, IndexMethod, SeekMode};

    fn table(pts: &[i64], keys: &[usize]) -> VideoIndex {
        VideoIndex {
            stream: 3,
            codec: "h264".into(),
            pixel_format: "yuv420p".into(),
            width: 320,
            height: 180,
            rotation: 90,
            mirror: true,
            time_base: (1, 90000),
            avg_fps: 29.97,
            frames: pts
                .iter()
                .enumerate()
                .map(|(i, &p)| FrameEntry {
                    pts: p,
                    duration: pts.get(i + 1).map_or(3003, |n| n - p),
                    key: keys.contains(&i),
                    stated_duration: if i == 2 { 0 } else { 3003 },
                })
                .collect(),
            keyframes: keys.to_vec().into(),
            declared_frames: 7,
            seek: SeekMode::FromStart,
            method: IndexMethod::DecodeScan,
            h264_nal_length: Some(4),
            damaged: true,
        }
    }

    fn record(path: &str, health: Health, t: Option<VideoIndex>) -> Record {
        let t = t.map(Arc::new);
        Record {
            key: Key {
                path: path.into(),
                size: 1234,
                mtime_ns: 1_700_000_000_123_456_789,
                stream: None,
            },
            health,
            decode_table: true,
            table: t,
            written_ms: 42,
            content: 0x5eed,
            node: crate::dataset::FileNode {
                dev: 0x801,
                ino: 123_456,
                ctime_ns: 1_700_000_001_000_000_007,
            },
        }
    }

    #[test]
    fn records_round_trip_and_regular_columns_cost_nothing_per_frame() {
        let damaged = Health::Damaged {
            frames: 5,
            first_bad_frame: 3,
            bad_ranges: vec![(3, 4)],
            reason: "decoder rejected a packet".into(),
        };
        // Irregular pts (i32 offsets), a wide column, and a linear one.
        let mut t = table(&[0, 3003, 6006, 9999, 12012], &[0, 3]);
        t.frames.make_mut()[4].stated_duration = i64::MAX;
        let r = record("/v/a b.mp4", damaged, Some(t));
        let back = format::decode(&format::encode(&r)).unwrap();
        assert_eq!(back, r);
        for h in [
            Health::Unchecked,
            Health::Ok { frames: 9 },
            Health::Unreadable {
                reason: "no video stream".into(),
                corrupt: false,
            },
            Health::Quarantined {
                reason: "crashed the daemon".into(),
            },
        ] {
            let r = record("/v/x.mkv", h, None);
            assert_eq!(format::decode(&format::encode(&r)).unwrap(), r);
        }
        // Constant frame rate: no per-frame numbers but the key bits.
        let n = 18_000;
        let pts: Vec<i64> = (0..n).map(|k| k * 3003).collect();
        let mut cfr = table(&pts, &[0, 300, 600]);
        cfr.frames
            .make_mut()
            .iter_mut()
            .for_each(|f| f.stated_duration = 3003);
        let bytes = format::encode(&record(
            "/v/long.mp4",
            Health::Ok { frames: 18_000 },
            Some(cfr),
        ));
        assert!(bytes.len() < 2_700, "{} bytes", bytes.len());
    }

    #[test]
    fn every_flipped_bit_and_truncation_is_refused() {
        let r = record(
            "/v/a.mp4",
            Health::Ok { frames: 3 },
            Some(table(&[0, 10, 25], &[0])),
        );
        let bytes = format::encode(&r);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(
                format::decode(&bad).is_err(),
                "bit flip at byte {i} accepted"
            );
        }
        for len in 0..bytes.len() {
            assert!(
                format::decode(&bytes[..len]).is_err(),
                "truncation to {len}"
            );
        }
        let mut v5 = bytes.clone();
        v5[8] = 5;
        assert_eq!(format::decode(&v5), Err(format::FormatError::Version(5)));
        // A version 1 record keeps its health; its table, which could not say whether the display matrix
        // mirrors, is built again. Neither version 1 nor 2 knew the content sample (0: unknown).
        let mut v1 = bytes.clone();
        v1[8] = 1;
        let old = format::decode(&v1).unwrap();
        assert_eq!(old.health, r.health);
        assert_eq!(old.key, r.key);
        assert!(old.table.is_none());
        assert_eq!(old.content, 0);
        // Versions 2 and 3 made up the timestamps of frames with no pts in tables made by decoding (as
        // `r`'s): such a table is built again, its health kept; one made by the packet scan is kept.
        let mut by_packets = r.clone();
        let mut t = (**by_packets.table.as_ref().unwrap()).clone();
        t.method = crate::index::IndexMethod::PacketScan;
        by_packets.table = Some(Arc::new(t));
        let packets = format::encode(&by_packets);
        for version in [2, 3] {
            let mut old = bytes.clone();
            old[8] = version;
            let old = format::decode(&old).unwrap();
            assert_eq!((old.table, &old.health), (None, &r.health), "v{version}");
            let mut old = packets.clone();
            old[8] = version;
            let old = format::decode(&old).unwrap();
            assert_eq!(old.table, by_packets.table, "v{version}");
            assert_eq!(old.content, if version == 2 { 0 } else { r.content });
            assert_eq!(
                old.node,
                crate::dataset::FileNode::default(),
                "unknown before v4"
            );
        }
        assert_eq!(
            format::decode(b"PK\x03\x04 not ours at all, a zip or anything"),
            Err(format::FormatError::Magic)
        );
        assert_eq!(format::crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn lookups_check_identity_and_ignore_what_they_cannot_trust() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let store = Store::open(&state, 1 << 20);
        let r = record(
            "/v/a.mp4",
            Health::Ok { frames: 3 },
            Some(table(&[0, 10, 25], &[0])),
        );
        assert_eq!(store.get(&r.key), None);
        store.put(&r).unwrap();
        let got = store.get(&r.key).unwrap();
        assert_eq!((got.health, got.table), (r.health.clone(), r.table.clone()));
        // Another version of the file, another stream: misses.
        let mut newer = r.key.clone();
        newer.mtime_ns += 1;
        assert_eq!(store.get(&newer), None);
        let mut other_stream = r.key.clone();
        other_stream.stream = Some(0);
        assert_eq!(store.get(&other_stream), None);
        // A record of another video placed where this one's lives (a foreign file): ignored.
        let other = record("/v/b.mp4", Health::Ok { frames: 3 }, None);
        std::fs::write(store.path_of(&r.key), format::encode(&other)).unwrap();
        assert_eq!(store.get(&r.key), None);
        // Garbage: ignored; a put replaces it.
        std::fs::write(store.path_of(&r.key), b"garbage").unwrap();
        assert_eq!(store.get(&r.key), None);
        store.put(&r).unwrap();
        assert!(store.get(&r.key).is_some());
        // Quarantine keeps the table.
        store
            .set_health(
                &r.key,
                Health::Quarantined {
                    reason: "SIGSEGV in the decoder".into(),
                },
            )
            .unwrap();
        let q = store.get(&r.key).unwrap();
        assert_eq!(q.health.status(), "quarantined");
        assert_eq!(q.table, r.table);
        // Safe to delete.
        std::fs::remove_dir_all(state.path(DIR)).unwrap();
        assert_eq!(store.get(&r.key), None);
        store.put(&r).unwrap();
        assert!(store.get(&r.key).is_some());
    }

    #[test]
    fn tables_are_held_packed_and_long_records_mapped() {
        // Irregular pts and durations (i32 offsets): 20,000 frames, a ~240 KB record.
        let pts: Vec<i64> = (0..20_000).map(|k| k * 3003 + (k % 7) * 11).collect();
        let keys: Vec<usize> = (0..20_000).step_by(30).collect();
        let mut t = table(&pts, &keys);
        t.seek = SeekMode::ByPts;
        let owned_bytes = t.approx_bytes();
        let packed = format::pack(t.clone());
        assert_eq!(packed, t, "packing changes no frame");
        assert!(packed.frames.is_packed() && !packed.frames.is_mapped());
        assert!(
            packed.approx_bytes() * 2 < owned_bytes,
            "{} vs {owned_bytes}",
            packed.approx_bytes()
        );
        assert_eq!(packed.keyframe_before(65), 60);
        assert_eq!(packed.frame_of_pts(pts[12_345]), Some(12_345));

        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&StateDir::open(dir.path()).unwrap(), 1 << 30);
        let long = record(
            "/v/long.mp4",
            Health::Ok { frames: 20_000 },
            Some(t.clone()),
        );
        let short = record(
            "/v/short.mp4",
            Health::Ok { frames: 3 },
            Some(table(&[0, 10, 25], &[0])),
        );
        store.put(&long).unwrap();
        store.put(&short).unwrap();
        assert!(std::fs::metadata(store.path_of(&long.key)).unwrap().len() >= MAP_AT);
        let got = store.get(&long.key).unwrap().table.unwrap();
        assert!(got.frames.is_mapped(), "a long record is mapped");
        assert_eq!(*got, t);
        // Mapped: the heap holds no frame, the cache weighs the mapping (8 KiB).
        assert_eq!(got.frames.heap_bytes(), 0);
        assert!(got.approx_bytes() < 8192 + 512, "{}", got.approx_bytes());
        // Replacing the record (rename) leaves the mapped table intact.
        store.put(&short).unwrap();
        store.put(&long).unwrap();
        assert_eq!(got.frames.at(19_999).pts, pts[19_999]);
        let small = store.get(&short.key).unwrap().table.unwrap();
        assert!(small.frames.is_packed() && !small.frames.is_mapped());
        assert_eq!(small.frames, short.table.as_ref().unwrap().frames);
    }

    #[test]
    fn the_bound_evicts_the_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        // A few hundred bytes, counted as the block they take.
        let len =
            format::encode(&record("/v/0000.mp4", Health::Ok { frames: 3 }, None)).len() as u64;
        assert!(len < 1000, "{len}");
        let one = on_disk(len);
        assert_eq!(one, 4096);
        let store = Store::open(&state, one * 10);
        let keys: Vec<Key> = (0..30)
            .map(|i| record(&format!("/v/{i:04}.mp4"), Health::Ok { frames: 3 }, None).key)
            .collect();
        let t0 = SystemTime::now() - std::time::Duration::from_secs(1000);
        for (i, k) in keys.iter().enumerate() {
            store
                .put(&record(
                    &k.path.to_string_lossy(),
                    Health::Ok { frames: 3 },
                    None,
                ))
                .unwrap();
            // Distinct ages without sleeping: record i was written at t0 + i s.
            std::fs::File::options()
                .write(true)
                .open(store.path_of(k))
                .unwrap()
                .set_modified(t0 + std::time::Duration::from_secs(i as u64))
                .unwrap();
            if i == 5 {
                // Read (and so refreshed) just before the bound is reached.
                assert!(store.get(&keys[0]).is_some());
            }
        }
        assert!(
            store.bytes_used() <= one * 10,
            "{} > {}",
            store.bytes_used(),
            one * 10
        );
        let kept: Vec<usize> = (0..30).filter(|&i| store.get(&keys[i]).is_some()).collect();
        // The newest writes stay, and the record read recently outlived its contemporaries.
        assert!(kept.contains(&29) && kept.contains(&0), "{kept:?}");
        assert!(!kept.contains(&1) && !kept.contains(&10), "{kept:?}");
    }
}
