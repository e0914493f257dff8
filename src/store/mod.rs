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
    /// Record files warned about as unreadable, untrusted or another video's, until written again: a
    /// request reads its video's record twice (a lookup, then the build), and each bad record was warned
    /// twice.
    warned: Mutex<std::collections::HashSet<String>>,
    /// Records deleted to keep within `max_bytes` since it was opened.
    evicted: std::sync::atomic::AtomicU64,
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
            warned: Mutex::new(std::collections::HashSet::new()),
            evicted: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Records deleted to keep the store within its bound since it was opened: tables a daemon will
    /// build again (`vserve index` that evicts has not done its job).
    pub fn evicted(&self) -> u64 {
        self.evicted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The records held now and what they take on disk ([`on_disk`]).
    pub fn held(&self) -> (u64, u64) {
        let files = self.walk();
        (files.len() as u64, files.iter().map(|f| f.1).sum())
    }

    /// Whether to warn about record file `name` now: once until it is written again.
    fn first_warning(&self, name: &str) -> bool {
        self.warned.lock().insert(name.to_owned())
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
                if self.first_warning(&name) {
                    tracing::warn!(file = %self.state.path(&name).display(), error = %e, "store record unreadable; ignoring it");
                }
                return None;
            }
        };
        let record = match format::decode_owned(bytes) {
            Ok(r) => r,
            Err(e) => {
                if self.first_warning(&name) {
                    tracing::warn!(file = %self.state.path(&name).display(), video = %key.path.display(), error = %e, "store record not trusted; ignoring it");
                }
                return None;
            }
        };
        if record.key.path != key.path || record.key.stream != key.stream {
            if !self.first_warning(&name) {
                return None;
            }
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
        self.warned.lock().remove(&name);
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
        let before = self
            .evicted
            .fetch_add(removed as u64, std::sync::atomic::Ordering::Relaxed);
        if before == 0 && removed > 0 {
            // Once a process: from here on tables are built again when their videos come back.
            tracing::warn!(
                removed,
                max = self.max_bytes,
                "the store is full (--store-bytes): its least recently used records are deleted and their tables built again when next used"
            );
        } else {
            tracing::debug!(
                removed,
                bytes = total,
                max = self.max_bytes,
                "store evicted its least recently used records"
            );
        }
    }
}

#[cfg(test)]
mod tests;
