//! The crash journal and the quarantine: a poison file (one that crashes the process inside FFmpeg or a
//! driver) takes the daemon down at most once.
//!
//! Input: the state directory, and the identity ([`FileKey`]: canonical path, size, mtime) of every file
//! a decode or index thread is about to open. Output: at start-up ([`recover`]), the files a previous
//! process was inside when it died, added to the [`Quarantine`], which the catalogue consults before it
//! opens anything: a quarantined file is refused (DATA_LOSS) until its identity changes.
//!
//! Journal: `journal/slot-N` in the state directory, one small file per thread that opens videos (decode
//! threads hold theirs; index builds borrow one from a pool). While a thread is inside a file its slot
//! reads `B <size> <mtime_ns> <path as hex>` (`D` for a run on a device); on a clean finish the first
//! byte becomes `I`; a thread abandoned past its deadline marks `S` (a stall, not a crash: not
//! quarantined); the thread that crashes the process marks `C` from the signal handler ([`crash`]).
//!
//! What a death means ([`recover`]):
//! - a `C` record: the process crashed inside that file. It is quarantined; the files other threads were
//!   inside (`B`, `D`) were bystanders and are not.
//! - no `C`: the process was killed (SIGKILL, the OOM killer), or the host went down. A `D` file (a GPU
//!   run, which can take the host down) is quarantined. A `B` file becomes a *suspect*: served as
//!   before, and quarantined only if a process dies inside it again before a run of it finishes (a
//!   finished run clears it). A kill costs no good file, and a file that takes the daemon down without
//!   a trace (an allocation the OOM killer ends) does so at most twice. Several records naming one file
//!   are one death of it (threads decoding a popular file together), judged by the strongest record.
//!
//! Cost: one `pwrite` per enter and per leave. A process crash keeps every write (the page cache outlives the process), and a
//! decoder in user space (FFmpeg on the CPU, index builds) can crash nothing else. A run that can take the
//! host down (NVDEC: a GPU driver in the kernel) also makes its record durable: one `fdatasync` when the
//! slot enters a file other than the last it made durable. Syncing for every CPU run too cost a training
//! stream 4-5% of its decode threads' time, blocked in the disk's cache flush (0.6 ms median, 8 ms p90
//! on this project's VM disk, once per clip).
//!
//! One process owns the journal: [`recover`] takes an exclusive `flock` on `journal/lock` (released by
//! the kernel when the process dies); another process on the same state directory gets no journal (and
//! reads the quarantine without touching the owner's records).
//!
//! Quarantine: `quarantine.json`, written atomically; entries leave it when the file at that path has
//! another identity (replaced or touched), when an operator clears them (`vserve quarantine clear`, the
//! Quarantine RPC: [`Quarantine::clear`]), or when an operator deletes the file. A clean shutdown clears
//! the journal ([`Journal::clear_all`]), so only a process that died leaves entries behind.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::dataset::CheckedFile;
use crate::refusal::RefusalLog;
use crate::state::StateDir;

mod crash;

/// Installs the crash handler without a journal (`--state-dir none`): it records nothing, and a fatal
/// signal sent from outside still ends the process by its default action (Rust's own handler swallowed
/// one `kill -SEGV`). Idempotent; the journal's recovery installs it too.
pub fn install_crash_handler() {
    crash::install();
}
mod judge;
mod slots;

/// The journal's directory inside the state directory.
pub const JOURNAL_DIR: &str = "journal";
/// The quarantine file inside the state directory.
pub const QUARANTINE_FILE: &str = "quarantine.json";

/// A file's identity: a file replaced or modified (new size or mtime) is another file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub path: PathBuf,
    pub size: u64,
    pub mtime_ns: i128,
}

impl FileKey {
    pub fn of(file: &CheckedFile) -> FileKey {
        FileKey {
            path: file.path.clone(),
            size: file.size,
            mtime_ns: file.mtime_ns,
        }
    }

    /// The journal record of a thread inside this file.
    fn record(&self) -> Vec<u8> {
        format!(
            "B {} {} {}\n",
            self.size,
            self.mtime_ns,
            hex(self.path.as_os_str().as_bytes())
        )
        .into_bytes()
    }

    fn parse_record(text: &[u8]) -> Option<(u8, FileKey)> {
        let line = text.split(|&b| b == b'\n').next()?;
        let line = std::str::from_utf8(line).ok()?;
        let mut parts = line.split(' ');
        let state = parts.next()?.bytes().next()?;
        let size = parts.next()?.parse().ok()?;
        let mtime_ns = parts.next()?.parse().ok()?;
        let path = PathBuf::from(std::ffi::OsString::from_vec(unhex(parts.next()?)?));
        Some((
            state,
            FileKey {
                path,
                size,
                mtime_ns,
            },
        ))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The journal: the lock that makes this process its owner, and a pool of slot files.
pub struct Journal {
    /// Holds the exclusive lock on `journal/lock` while the journal lives.
    _lock: File,
    pool: Arc<Pool>,
}

/// The slot files of the journal.
struct Pool {
    dir: PathBuf,
    /// Slot files not held by a thread (returned by index builds), with their numbers.
    free: Mutex<Vec<(usize, File)>>,
    next: AtomicUsize,
    /// Records made durable (`fdatasync`) so far, by every slot.
    syncs: AtomicU64,
    /// Told when a run finishes, to clear a suspect.
    quarantine: Arc<Quarantine>,
}

impl Journal {
    /// Records made durable so far (`fdatasync`s of entering runs that drive a device).
    pub fn syncs(&self) -> u64 {
        self.pool.syncs.load(Ordering::Relaxed)
    }

    /// A slot of the journal for one thread: a free one, or a new file.
    pub fn slot(&self) -> std::io::Result<JournalSlot> {
        let pool = &self.pool;
        let taken = pool.free.lock().pop();
        let (n, file) = match taken {
            Some(t) => t,
            None => {
                let (n, file) = slots::create(pool)?;
                // The new name must survive a host crash for its records to be found.
                sync_dir(&pool.dir)?;
                (n, file)
            }
        };
        Ok(JournalSlot {
            pool: pool.clone(),
            n,
            inner: Mutex::new(SlotInner {
                file: Some(file),
                named: None,
                busy: false,
            }),
        })
    }

    /// At a clean exit: nothing crashed, so nothing the journal names is a suspect (threads still
    /// stuck in a read included).
    pub fn clear_all(&self) {
        if let Ok(entries) = std::fs::read_dir(&self.pool.dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("slot-") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// Logs that `path` could not be recorded in the journal (a full or read-only state directory): the
/// first failure, then a line a minute with the count left out ([`RefusalLog::minutely`]), not one line
/// per decode.
pub fn warn_unrecorded(path: &Path, error: &std::io::Error) {
    let due = RefusalLog::minutely().note_at("journal", "unrecorded", std::time::Instant::now());
    if let Some(suppressed) = due {
        tracing::warn!(path = %path.display(), %error, suppressed, "cannot record the file in the crash journal: a crash while decoding it cannot be traced to it");
    }
}

/// Whether the file at an entry's path still has the entry's size and mtime (true when it cannot be
/// read now).
pub fn unchanged(q: &Quarantined) -> bool {
    let Ok(meta) = std::fs::metadata(&q.key.path) else {
        return true;
    };
    meta.len() == q.key.size && crate::dataset::mtime_ns(&meta) == q.key.mtime_ns
}

/// A busy record's state byte: `D` for a run that can take the host down (a device), else `B`.
fn busy_byte(durable: bool) -> u8 {
    if durable {
        b'D'
    } else {
        b'B'
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// One thread's place in the journal. Dropping it marks it idle and returns it to the pool.
pub struct JournalSlot {
    pool: Arc<Pool>,
    n: usize,
    inner: Mutex<SlotInner>,
}

struct SlotInner {
    file: Option<File>,
    /// The identity this slot's record names, and whether that record is durable (synced).
    named: Option<(FileKey, bool)>,
    busy: bool,
}

impl JournalSlot {
    /// Records that this thread is about to open `key`. `durable`: the record is on disk when this
    /// returns (`fdatasync` unless the record already names `key` durably), for a run that can take the
    /// host down (a kernel driver, NVDEC); otherwise one `pwrite`, which the page cache keeps through a
    /// crash of this process, the only crash a decoder in user space can cause.
    pub fn enter(&self, key: &FileKey, durable: bool) -> std::io::Result<()> {
        let mut inner = self.inner.lock();
        let Some(file) = inner.file.as_ref() else {
            return Ok(());
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(file);
        match &inner.named {
            // The record names this file already (durably, when that is asked): flipping the state
            // byte back to busy is enough.
            Some((named, synced)) if named == key && (*synced || !durable) => {
                file.write_all_at(&[busy_byte(durable)], 0)?;
            }
            _ => {
                let mut record = key.record();
                record[0] = busy_byte(durable);
                file.write_all_at(&record, 0)?;
                if durable {
                    file.sync_data()?;
                    self.pool.syncs.fetch_add(1, Ordering::Relaxed);
                }
                inner.named = Some((key.clone(), durable));
            }
        }
        inner.busy = true;
        crash::set_inside(fd);
        Ok(())
    }

    /// Records a clean finish (an error the decoder returned is a clean finish too).
    pub fn leave(&self) {
        let mut inner = self.inner.lock();
        if inner.busy {
            if let Some(f) = inner.file.as_ref() {
                crash::set_left(std::os::fd::AsRawFd::as_raw_fd(f));
                if let Err(e) = f.write_all_at(b"I", 0) {
                    tracing::warn!(slot = self.n, error = %e, "cannot update the crash journal");
                }
            }
            inner.busy = false;
            if let Some((key, _)) = &inner.named {
                self.pool.quarantine.finished(key);
            }
        }
    }

    /// Records that the thread was abandoned past its deadline: a stall, not a crash.
    pub fn mark_stalled(&self) {
        let inner = self.inner.lock();
        if inner.busy {
            if let Some(f) = inner.file.as_ref() {
                let _ = f.write_all_at(b"S", 0);
            }
        }
    }
}

impl Drop for JournalSlot {
    fn drop(&mut self) {
        self.leave();
        if let Some(file) = self.inner.lock().file.take() {
            self.pool.free.lock().push((self.n, file));
        }
    }
}

/// A quarantined file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    pub key: FileKey,
    /// When it was quarantined (seconds since the epoch).
    pub since: u64,
    /// How the process died inside it ([`Quarantine::REASON`] for entries written before there were
    /// several).
    pub why: String,
}

/// The files that crashed a daemon, by path.
pub struct Quarantine {
    /// Where the set is persisted (None: kept in memory only).
    state: Option<StateDir>,
    files: Mutex<HashMap<PathBuf, Quarantined>>,
    /// Files a process was inside when it was killed (no crash recorded): served, and quarantined if a
    /// process dies inside one again before a run of it finishes (module comment).
    suspects: Mutex<HashMap<PathBuf, Quarantined>>,
    /// Whether `suspects` may be non-empty: a finished run checks it without a lock.
    any_suspects: std::sync::atomic::AtomicBool,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct QuarantineFile {
    version: u32,
    files: Vec<QuarantineEntry>,
    #[serde(default)]
    suspects: Vec<QuarantineEntry>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct QuarantineEntry {
    /// For people reading the file (lossy for paths that are not UTF-8).
    path: String,
    /// The exact path bytes, hex: what is read back.
    path_hex: String,
    size: u64,
    mtime_ns: i64,
    since: u64,
    #[serde(default)]
    why: String,
}

impl Quarantine {
    /// An empty quarantine kept in memory (no state directory).
    pub fn in_memory() -> Quarantine {
        Quarantine::kept_in(None)
    }

    fn kept_in(state: Option<StateDir>) -> Quarantine {
        Quarantine {
            state,
            files: Mutex::new(HashMap::new()),
            suspects: Mutex::new(HashMap::new()),
            any_suspects: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A run of `key`'s file finished: it is no longer a suspect.
    fn finished(&self, key: &FileKey) {
        if !self.any_suspects.load(Ordering::Relaxed) {
            return;
        }
        let mut suspects = self.suspects.lock();
        if suspects.get(&key.path).is_some_and(|q| q.key == *key) {
            suspects.remove(&key.path);
            self.any_suspects
                .store(!suspects.is_empty(), Ordering::Relaxed);
            tracing::info!(path = %key.path.display(), "a run of a suspect file finished; no longer a suspect");
            let files = self.files.lock();
            self.persist(self.serialise(&files, &suspects));
        }
    }

    /// The files suspected (a process was killed inside them once), by path.
    pub fn suspects(&self) -> Vec<Quarantined> {
        let mut out: Vec<Quarantined> = self.suspects.lock().values().cloned().collect();
        out.sort_by(|a, b| a.key.path.cmp(&b.key.path));
        out
    }

    /// The quarantine record of `key`'s file, if it is that file (same identity). A quarantined path
    /// whose file has changed leaves the quarantine here: it is tried again.
    pub fn check(&self, key: &FileKey) -> Option<Quarantined> {
        let mut files = self.files.lock();
        let q = files.get(&key.path)?;
        if q.key == *key {
            return Some(q.clone());
        }
        tracing::info!(path = %key.path.display(), "quarantined file has changed; trying it again");
        files.remove(&key.path);
        // Written under the lock: a snapshot never overwrites a later one (a concurrent clear).
        self.persist(self.serialise(&files, &self.suspects.lock()));
        None
    }

    pub fn len(&self) -> usize {
        self.files.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the set is kept, for messages.
    pub fn location(&self) -> String {
        self.state.as_ref().map_or_else(
            || "memory (no --state-dir)".to_owned(),
            |s| s.path(QUARANTINE_FILE).display().to_string(),
        )
    }

    /// Why every entry is there (the journal records no more than that a thread was inside the file).
    pub const REASON: &'static str = "a daemon died while opening, indexing or decoding this file";

    /// Drops the entries whose file now has another size or mtime, as a request for the file would:
    /// what an operator lists is what is refused. A file that cannot be read now keeps its entry (it
    /// may come back as it was).
    pub fn forget_changed(&self) {
        let mut files = self.files.lock();
        let before = files.len();
        files.retain(|path, q| {
            let keep = unchanged(q);
            if !keep {
                tracing::info!(path = %path.display(), "quarantined file has changed; trying it again");
            }
            keep
        });
        if files.len() != before {
            self.persist(self.serialise(&files, &self.suspects.lock()));
        }
    }

    /// The entries, by path.
    pub fn list(&self) -> Vec<Quarantined> {
        let mut out: Vec<Quarantined> = self.files.lock().values().cloned().collect();
        out.sort_by(|a, b| a.key.path.cmp(&b.key.path));
        out
    }

    /// Removes the entries of `paths` (every entry with `all`), in the persisted file first and then in
    /// memory, under one lock: either both change or neither. A path not in the quarantine is an error
    /// and clears nothing (`Err(Ok(path))`); a failed write clears nothing (`Err(Err(io))`).
    pub fn clear(
        &self,
        paths: &[PathBuf],
        all: bool,
    ) -> Result<Vec<Quarantined>, Result<PathBuf, std::io::Error>> {
        let mut files = self.files.lock();
        if let Some(p) = paths.iter().find(|p| !files.contains_key(*p)) {
            return Err(Ok(p.clone()));
        }
        let mut kept = files.clone();
        let mut cleared: Vec<Quarantined> = if all {
            kept.drain().map(|(_, q)| q).collect()
        } else {
            paths.iter().filter_map(|p| kept.remove(p)).collect()
        };
        if let Some(state) = &self.state {
            state
                .write_atomic(
                    QUARANTINE_FILE,
                    &self.serialise(&kept, &self.suspects.lock()),
                )
                .map_err(Err)?;
        }
        *files = kept;
        cleared.sort_by(|a, b| a.key.path.cmp(&b.key.path));
        Ok(cleared)
    }

    /// The persisted quarantine of a state directory, read without taking its journal (for
    /// `vserve quarantine list --state-dir`); None when the directory does not exist.
    pub fn read_persisted(root: &Path) -> std::io::Result<Option<Quarantine>> {
        if !root.is_dir() {
            return Ok(None);
        }
        let state = StateDir::open(root)?;
        Quarantine::parse(&state).map(Some).map_err(|why| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {why}", state.path(QUARANTINE_FILE).display()),
            )
        })
    }

    fn add(&self, q: Quarantined) {
        self.files.lock().insert(q.key.path.clone(), q);
    }

    fn suspect(&self, q: Quarantined) {
        self.suspects.lock().insert(q.key.path.clone(), q);
        self.any_suspects.store(true, Ordering::Relaxed);
    }

    /// Whether `key`'s file is a suspect (and, if so, no longer: it is quarantined or forgiven next).
    fn take_suspect(&self, key: &FileKey) -> bool {
        let mut suspects = self.suspects.lock();
        let was = suspects.get(&key.path).is_some_and(|q| q.key == *key);
        if was {
            suspects.remove(&key.path);
        }
        was
    }

    fn serialise(
        &self,
        files: &HashMap<PathBuf, Quarantined>,
        suspects: &HashMap<PathBuf, Quarantined>,
    ) -> Vec<u8> {
        let entries = |set: &HashMap<PathBuf, Quarantined>| {
            let mut list: Vec<QuarantineEntry> = set
                .values()
                .map(|q| QuarantineEntry {
                    path: q.key.path.display().to_string(),
                    path_hex: hex(q.key.path.as_os_str().as_bytes()),
                    size: q.key.size,
                    mtime_ns: i64::try_from(q.key.mtime_ns).unwrap_or(i64::MAX),
                    since: q.since,
                    why: q.why.clone(),
                })
                .collect();
            list.sort_by(|a, b| a.path_hex.cmp(&b.path_hex));
            list
        };
        let mut out = serde_json::to_vec_pretty(&QuarantineFile {
            version: 1,
            files: entries(files),
            suspects: entries(suspects),
        })
        .unwrap_or_default();
        out.push(b'\n');
        out
    }

    fn persist(&self, bytes: Vec<u8>) {
        if let Some(state) = &self.state {
            if let Err(e) = state.write_atomic(QUARANTINE_FILE, &bytes) {
                tracing::warn!(error = %e, file = %state.path(QUARANTINE_FILE).display(), "cannot write the quarantine");
            }
        }
    }

    /// The quarantine persisted in `state` (empty when there is no file). Err when the file exists but
    /// cannot be read or parsed, or is of another version: its entries are then unknown, not none.
    fn parse(state: &StateDir) -> Result<Quarantine, String> {
        let q = Quarantine::kept_in(Some(state.clone()));
        let bytes = match state.read(QUARANTINE_FILE) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(q),
            Err(e) => return Err(format!("cannot read it: {e}")),
        };
        let f = serde_json::from_slice::<QuarantineFile>(&bytes)
            .map_err(|e| format!("not a quarantine file: {e}"))?;
        if f.version != 1 {
            return Err(format!("version {}, this build reads 1", f.version));
        }
        let read = |e: QuarantineEntry| {
            let path = unhex(&e.path_hex)?;
            Some(Quarantined {
                key: FileKey {
                    path: PathBuf::from(std::ffi::OsString::from_vec(path)),
                    size: e.size,
                    mtime_ns: e.mtime_ns as i128,
                },
                since: e.since,
                why: if e.why.is_empty() {
                    Quarantine::REASON.to_owned()
                } else {
                    e.why
                },
            })
        };
        f.files.into_iter().filter_map(read).for_each(|e| q.add(e));
        f.suspects
            .into_iter()
            .filter_map(read)
            .for_each(|e| q.suspect(e));
        Ok(q)
    }

    /// [`Quarantine::parse`] for the daemon: a file it cannot parse is moved aside (never overwritten,
    /// which lost its entries: files that crashed the daemon were served again), with a warning naming
    /// where it went, and the daemon starts with an empty quarantine.
    fn load(state: &StateDir) -> Quarantine {
        match Quarantine::parse(state) {
            Ok(q) => q,
            Err(why) => {
                let file = state.path(QUARANTINE_FILE);
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let aside = state.path(&format!("{QUARANTINE_FILE}.unreadable-{secs}"));
                match std::fs::rename(&file, &aside) {
                    Ok(()) => tracing::warn!(
                        file = %file.display(), kept_as = %aside.display(), error = %why,
                        "unreadable quarantine file moved aside; starting with an empty quarantine (fix the file and move it back while the daemon is stopped to restore its entries)"
                    ),
                    Err(e) => tracing::warn!(
                        file = %file.display(), error = %why, rename_error = %e,
                        "unreadable quarantine file, which cannot be moved aside either; starting with an empty quarantine"
                    ),
                }
                Quarantine::kept_in(Some(state.clone()))
            }
        }
    }
}

/// Opens the journal in `state` and moves what a previous process left in it into the quarantine
/// (persisted before the journal is cleared, so a crash now loses nothing). No journal (None) when
/// another live process holds it.
pub fn recover(state: &StateDir) -> std::io::Result<(Option<Arc<Journal>>, Arc<Quarantine>)> {
    use std::os::fd::AsRawFd;
    let dir = state.path(JOURNAL_DIR);
    std::fs::create_dir_all(&dir)?;
    let quarantine = Quarantine::load(state);
    let (lock, _) = crate::state::open_regular(
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true),
        &dir.join("lock"),
    )?;
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            tracing::warn!(dir = %dir.display(), "another vserve process holds this crash journal; this one records nothing");
            return Ok((None, Arc::new(quarantine)));
        }
        return Err(e);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (slots, inside) = slots::read_left(&dir)?;
    let changed = judge::judge(&quarantine, inside, now);
    if changed {
        let bytes = quarantine.serialise(&quarantine.files.lock(), &quarantine.suspects.lock());
        state.write_atomic(QUARANTINE_FILE, &bytes)?;
    }
    for p in slots {
        std::fs::remove_file(&p)?;
    }
    sync_dir(&dir)?;
    if !quarantine.is_empty() {
        tracing::info!(files = quarantine.len(), file = %quarantine.location(), "files in quarantine");
    }
    let quarantine = Arc::new(quarantine);
    crash::install();
    let journal = Arc::new(Journal {
        _lock: lock,
        pool: Arc::new(Pool {
            dir,
            free: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            syncs: AtomicU64::new(0),
            quarantine: quarantine.clone(),
        }),
    });
    Ok((Some(journal), quarantine))
}

#[cfg(test)]
mod tests;
