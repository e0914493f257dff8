//! Shared-memory arenas: files under the shm directory (default /dev/shm) holding batch bytes for clients
//! on the daemon's host.
//!
//! Input: batches' bytes. Output: [`ShmRef`]s (file, slot, offset) the api puts in the batch header
//! instead of the bytes.
//!
//! - A stream owns one arena of `slots` equal slots, created at its first batch. A slot is written only
//!   after the client released it ([`Arena::acquire`] waits), so a client's mapped view never changes under
//!   it until it says so; a client that releases nothing stalls only its own stream.
//! - A GetClips reply gets a one-slot arena, removed when released or, unreleased, after the registry's
//!   time to live.
//! - Files are named `vserve-<daemon pid>-<128 random bits>`, created with the configured mode (0640:
//!   clients must share the daemon's group), removed when their arena is dropped (the stream ends, the
//!   client disconnects or crashes), and at start-up when the pid in their name is not a live process.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Released reusable GetClips arenas kept for later replies: at most this many...
pub const SPARE_ARENAS: usize = 4;
/// ... holding at most this many bytes together.
pub const SPARE_BYTES: usize = 512 << 20;
/// Reusable GetClips arenas are sized in multiples of this, so replies of similar sizes share them.
pub const SPARE_ROUND: usize = 1 << 20;

/// Where a batch's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmRef {
    pub path: PathBuf,
    pub arena: String,
    pub slot: u32,
    pub offset: u64,
    pub arena_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("cannot create shared-memory arena {path}: {reason}")]
    Create { path: String, reason: String },
    #[error("{nbytes} bytes do not fit a slot of {slot_bytes}")]
    TooLarge { nbytes: usize, slot_bytes: usize },
    #[error("no shared-memory arena {0:?} (released, expired, or not this daemon's)")]
    UnknownArena(String),
    #[error("arena {arena:?} has no slot {slot}")]
    BadSlot { arena: String, slot: u32 },
}

/// A file of `slots` slots of `slot_bytes`, mapped into the daemon.
pub struct Arena {
    name: String,
    path: PathBuf,
    map: memmap2::MmapRaw,
    slot_bytes: usize,
    /// Per slot: free to write.
    free: Mutex<Vec<bool>>,
    released: Notify,
}

// SAFETY: the mapping is written only through `write`, into a slot its caller acquired (owned exclusively
// until released); MmapRaw hands out raw pointers and holds no Rust references to the memory.
unsafe impl Sync for Arena {}

impl Arena {
    fn create(dir: &Path, mode: u32, slot_bytes: usize, slots: usize) -> Result<Arena, ShmError> {
        let name = format!("vserve-{}-{}", std::process::id(), random_hex());
        let path = dir.join(&name);
        let err = |e: std::io::Error| ShmError::Create {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .map_err(err)?;
        let total = slot_bytes.max(1) * slots.max(1);
        let mapped = file
            .set_len(total as u64)
            .and_then(|()| memmap2::MmapRaw::map_raw(&file));
        let map = match mapped {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(err(e));
            }
        };
        Ok(Arena {
            name,
            path,
            map,
            slot_bytes: slot_bytes.max(1),
            free: Mutex::new(vec![true; slots.max(1)]),
            released: Notify::new(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Waits for a free slot and takes it.
    pub async fn acquire(&self) -> u32 {
        loop {
            let notified = self.released.notified();
            if let Some(slot) = self.try_acquire() {
                return slot;
            }
            notified.await;
        }
    }

    fn try_acquire(&self) -> Option<u32> {
        let mut free = self.free.lock();
        let slot = free.iter().position(|&f| f)?;
        free[slot] = false;
        Some(slot as u32)
    }

    /// Copies `data` into a slot the caller acquired.
    pub fn write(&self, slot: u32, data: &[u8]) -> Result<ShmRef, ShmError> {
        if data.len() > self.slot_bytes {
            return Err(ShmError::TooLarge {
                nbytes: data.len(),
                slot_bytes: self.slot_bytes,
            });
        }
        let offset = slot as usize * self.slot_bytes;
        if offset + self.slot_bytes > self.map.len() {
            return Err(ShmError::BadSlot {
                arena: self.name.clone(),
                slot,
            });
        }
        // SAFETY: [offset, offset + len) lies inside the mapping (checked above) and inside the slot
        // the caller acquired, which nothing else writes until it is released.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.as_mut_ptr().add(offset),
                data.len(),
            );
        }
        Ok(ShmRef {
            path: self.path.clone(),
            arena: self.name.clone(),
            slot,
            offset: offset as u64,
            arena_bytes: self.map.len() as u64,
        })
    }

    /// Runs `f` on the first `nbytes` of a slot the caller acquired (assembling a batch in place); on
    /// failure the slot is released again.
    pub fn fill<T, E>(
        &self,
        slot: u32,
        nbytes: usize,
        f: impl FnOnce(&mut [u8]) -> Result<T, E>,
    ) -> Result<(T, ShmRef), E>
    where
        E: From<ShmError>,
    {
        let offset = slot as usize * self.slot_bytes;
        if nbytes > self.slot_bytes || offset + self.slot_bytes > self.map.len() {
            let _ = self.release(&[slot]);
            return Err(ShmError::TooLarge {
                nbytes,
                slot_bytes: self.slot_bytes,
            }
            .into());
        }
        // SAFETY: the range lies inside the mapping (checked above) and inside the slot the caller
        // acquired, which nothing else reads or writes in this process until it is released; the client
        // reads it only after the reply announcing it.
        let buf =
            unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset), nbytes) };
        match f(buf) {
            Ok(v) => Ok((
                v,
                ShmRef {
                    path: self.path.clone(),
                    arena: self.name.clone(),
                    slot,
                    offset: offset as u64,
                    arena_bytes: self.map.len() as u64,
                },
            )),
            Err(e) => {
                let _ = self.release(&[slot]);
                Err(e)
            }
        }
    }

    /// Marks slots free again, all or none: every slot is checked before any is freed, so a list with
    /// a bad slot changes nothing (and a good one never leaves a waiter unwoken).
    fn release(&self, slots: &[u32]) -> Result<(), ShmError> {
        {
            let mut free = self.free.lock();
            if let Some(&bad) = slots.iter().find(|&&s| s as usize >= free.len()) {
                return Err(ShmError::BadSlot {
                    arena: self.name.clone(),
                    slot: bad,
                });
            }
            for &s in slots {
                free[s as usize] = true;
            }
        }
        self.released.notify_waiters();
        Ok(())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// 128 random bits as hex, from the kernel's generator.
fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        // Without /dev/urandom (never on Linux): time and address entropy, still unique per process.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let a = &bytes as *const _ as usize as u128;
        bytes = (t ^ a.rotate_left(64)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A GetClips reply's arena until released: (arena, when it was sent, whether the client lets it be
/// reused after releasing it).
type OneShot = (Arc<Arena>, Instant, bool);

/// The daemon's arenas: streams' (weakly: a stream's end drops its arena) and GetClips' one-shot ones
/// (held until released or expired).
pub struct ShmRegistry {
    dir: PathBuf,
    mode: u32,
    ttl: Duration,
    streams: Mutex<HashMap<String, Weak<Arena>>>,
    /// GetClips replies not released yet.
    one_shot: Mutex<HashMap<String, OneShot>>,
    /// Released reusable GetClips arenas, ready for the next reply that fits (at most [`SPARE_ARENAS`] and
    /// [`SPARE_BYTES`]; each dropped after the time to live unused).
    spare: Mutex<Vec<(Arc<Arena>, Instant)>>,
    /// Arenas of streams that ended with slots the client has not released yet: kept until it does,
    /// or for the time to live.
    retired: Mutex<HashMap<String, (Arc<Arena>, Instant)>>,
}

impl ShmRegistry {
    pub fn new(dir: PathBuf, mode: u32, ttl: Duration) -> ShmRegistry {
        ShmRegistry {
            dir,
            mode,
            ttl,
            streams: Mutex::new(HashMap::new()),
            one_shot: Mutex::new(HashMap::new()),
            spare: Mutex::new(Vec::new()),
            retired: Mutex::new(HashMap::new()),
        }
    }

    /// Removes arena files left by daemons that are no longer running. Returns how many.
    pub fn remove_stale(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(pid) = name
                .strip_prefix("vserve-")
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
            if !alive && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// A stream's arena; dropped (and its file removed) with the last reference.
    pub fn stream_arena(&self, slot_bytes: usize, slots: usize) -> Result<Arc<Arena>, ShmError> {
        let arena = Arc::new(Arena::create(&self.dir, self.mode, slot_bytes, slots)?);
        let mut map = self.streams.lock();
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(arena.name.clone(), Arc::downgrade(&arena));
        Ok(arena)
    }

    /// Puts one reply's bytes in a one-slot arena kept until released or expired.
    pub fn one_shot(&self, data: &[u8]) -> Result<ShmRef, ShmError> {
        self.one_shot_with(data.len(), false, |buf| {
            buf.copy_from_slice(data);
            Ok::<_, ShmError>(())
        })
        .map(|((), r)| r)
    }

    /// A one-slot arena of `nbytes` that `f` fills in place (a reply assembled straight into shared
    /// memory, with no intermediate buffer), kept until released or expired; nothing is kept if `f` fails.
    ///
    /// `reusable`: the client releases the slot only once it reads nothing of it any more, so after the
    /// release the arena goes to the spare pool and a later reusable reply that fits takes it (its pages
    /// are already there: no new file, no zero-filling). Such arenas are made a little larger than asked
    /// (rounded up to [`SPARE_ROUND`]) so that replies of similar sizes share them.
    pub fn one_shot_with<T, E>(
        &self,
        nbytes: usize,
        reusable: bool,
        f: impl FnOnce(&mut [u8]) -> Result<T, E>,
    ) -> Result<(T, ShmRef), E>
    where
        E: From<ShmError>,
    {
        self.expire();
        let arena = match reusable.then(|| self.take_spare(nbytes)).flatten() {
            Some(a) => a,
            None => {
                let size = if reusable {
                    nbytes.div_ceil(SPARE_ROUND).max(1) * SPARE_ROUND
                } else {
                    nbytes
                };
                Arc::new(Arena::create(&self.dir, self.mode, size, 1)?)
            }
        };
        let slot = arena.try_acquire().ok_or_else(|| ShmError::BadSlot {
            arena: arena.name.clone(),
            slot: 0,
        })?;
        let (v, r) = match arena.fill(slot, nbytes, f) {
            Ok(done) => done,
            Err(e) => {
                // fill() freed the slot again; a reusable arena goes back to the pool.
                if reusable {
                    self.put_spare(arena);
                }
                return Err(e);
            }
        };
        self.one_shot
            .lock()
            .insert(arena.name.clone(), (arena, Instant::now(), reusable));
        Ok((v, r))
    }

    /// The smallest spare arena that holds `nbytes` without wasting more than half of itself.
    fn take_spare(&self, nbytes: usize) -> Option<Arc<Arena>> {
        let mut spare = self.spare.lock();
        let fits =
            |a: &Arena| a.slot_bytes >= nbytes && a.slot_bytes / 2 <= nbytes.max(SPARE_ROUND);
        let best = spare
            .iter()
            .enumerate()
            .filter(|(_, (a, _))| fits(a))
            .min_by_key(|(_, (a, _))| a.slot_bytes)
            .map(|(i, _)| i)?;
        Some(spare.swap_remove(best).0)
    }

    /// Keeps a released reusable arena for later replies, within the pool's bounds (the newest stay).
    fn put_spare(&self, arena: Arc<Arena>) {
        if arena.slot_bytes > SPARE_BYTES {
            return;
        }
        let mut spare = self.spare.lock();
        spare.push((arena, Instant::now()));
        while spare.len() > SPARE_ARENAS
            || spare.iter().map(|(a, _)| a.slot_bytes).sum::<usize>() > SPARE_BYTES
        {
            spare.remove(0);
        }
    }

    /// Drops one-shot and retired arenas older than the time to live, and spare ones unused that long.
    /// (An expired one-shot reply is dropped, never pooled: its client may still be reading it.)
    pub fn expire(&self) {
        let ttl = self.ttl;
        self.one_shot
            .lock()
            .retain(|_, (_, at, _)| at.elapsed() < ttl);
        self.spare.lock().retain(|(_, at)| at.elapsed() < ttl);
        self.retired.lock().retain(|_, (_, at)| at.elapsed() < ttl);
    }

    /// A stream ended normally: its arena stays until the client has released every slot (it may not
    /// have read the last batches yet), or for the time to live.
    pub fn retire(&self, arena: Arc<Arena>) {
        if arena.free.lock().iter().all(|&f| f) && Arc::strong_count(&arena) == 1 {
            return;
        }
        self.retired
            .lock()
            .insert(arena.name.clone(), (arena, Instant::now()));
    }

    pub fn release(&self, arena: &str, slots: &[u32]) -> Result<(), ShmError> {
        let one_shot = self.one_shot.lock().remove(arena);
        if let Some((a, _, reusable)) = one_shot {
            if reusable {
                a.release(slots)?;
                if a.free.lock().iter().all(|&f| f) {
                    self.put_spare(a);
                }
            }
            return Ok(());
        }
        let retired = self.retired.lock().get(arena).map(|(a, _)| a.clone());
        if let Some(a) = retired {
            a.release(slots)?;
            if a.free.lock().iter().all(|&f| f) {
                self.retired.lock().remove(arena);
            }
            return Ok(());
        }
        let found = self.streams.lock().get(arena).and_then(Weak::upgrade);
        match found {
            Some(a) => a.release(slots),
            None => Err(ShmError::UnknownArena(arena.to_owned())),
        }
    }

    /// Arenas open now.
    pub fn open_arenas(&self) -> u64 {
        self.expire();
        let streams = self
            .streams
            .lock()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count();
        let retired_only = self
            .retired
            .lock()
            .keys()
            .filter(|k| !self.streams.lock().contains_key(*k))
            .count();
        (streams + self.one_shot.lock().len() + self.spare.lock().len() + retired_only) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_are_reused_only_after_release_and_files_go_with_their_arena() {
        let dir = tempfile::tempdir().unwrap();
        let reg = ShmRegistry::new(dir.path().into(), 0o600, Duration::from_secs(60));
        let arena = reg.stream_arena(4, 2).unwrap();
        let path = dir.path().join(arena.name());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8);
        let a = arena.acquire().await;
        let b = arena.acquire().await;
        let ra = arena.write(a, &[1, 2, 3, 4]).unwrap();
        arena.write(b, &[5, 6]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[ra.offset as usize..][..4], &[1, 2, 3, 4]);
        assert!(matches!(
            arena.write(a, &[0; 5]),
            Err(ShmError::TooLarge { .. })
        ));
        // Both slots taken: a third acquire waits until a release.
        let waiter = {
            let arena = arena.clone();
            tokio::spawn(async move { arena.acquire().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        reg.release(arena.name(), &[b]).unwrap();
        assert_eq!(waiter.await.unwrap(), b);
        assert_eq!(reg.open_arenas(), 1);
        drop(arena);
        assert!(!path.exists(), "file removed with its arena");
        assert_eq!(reg.open_arenas(), 0);

        let r = reg.one_shot(&[9; 10]).unwrap();
        assert_eq!(std::fs::read(&r.path).unwrap(), vec![9; 10]);
        reg.release(&r.arena, &[0]).unwrap();
        assert!(!r.path.exists());
        assert!(matches!(
            reg.release(&r.arena, &[0]),
            Err(ShmError::UnknownArena(_))
        ));
    }

    #[tokio::test]
    async fn a_release_with_a_bad_slot_frees_nothing_and_a_good_one_wakes_the_waiter() {
        let dir = tempfile::tempdir().unwrap();
        let reg = ShmRegistry::new(dir.path().into(), 0o600, Duration::from_secs(60));
        let arena = reg.stream_arena(4, 1).unwrap();
        let slot = arena.acquire().await;
        let waiter = {
            let arena = arena.clone();
            tokio::spawn(async move { arena.acquire().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let e = reg.release(arena.name(), &[slot, 7]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("arena {:?} has no slot 7", arena.name())
        );
        // Nothing was freed: the waiter still waits, and the slot is still taken.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        assert_eq!(arena.try_acquire(), None);
        // The good slot alone: freed, and the waiter wakes with it.
        reg.release(arena.name(), &[slot]).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter woke")
            .unwrap();
        assert_eq!(got, slot);
    }

    #[test]
    fn released_reusable_replies_lend_their_arena_to_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let reg = ShmRegistry::new(dir.path().into(), 0o600, Duration::from_secs(60));
        let fill = |reg: &ShmRegistry, n: usize, v: u8, reusable: bool| {
            reg.one_shot_with(n, reusable, |b| {
                b.fill(v);
                Ok::<_, ShmError>(())
            })
            .unwrap()
            .1
        };
        let a = fill(&reg, 1000, 1, true);
        // Not released yet: a second reply gets its own arena.
        let b = fill(&reg, 1000, 2, true);
        assert_ne!(a.arena, b.arena);
        reg.release(&a.arena, &[0]).unwrap();
        assert!(a.path.exists(), "a released reusable arena is kept");
        assert_eq!(reg.open_arenas(), 2);
        // The next reply that fits takes it, with its own bytes.
        let c = fill(&reg, 900, 3, true);
        assert_eq!(c.arena, a.arena);
        let bytes = std::fs::read(&c.path).unwrap();
        assert_eq!(&bytes[..900], &[3; 900][..]);
        // Released twice is unknown, as before.
        reg.release(&c.arena, &[0]).unwrap();
        assert!(matches!(
            reg.release(&c.arena, &[0]),
            Err(ShmError::UnknownArena(_))
        ));
        // A reply far larger than every spare gets a new arena; a non-reusable reply never takes a
        // spare, and its arena goes with its release.
        let big = fill(&reg, 3 * SPARE_ROUND, 4, true);
        assert_ne!(big.arena, a.arena);
        let plain = fill(&reg, 10, 5, false);
        assert_ne!(plain.arena, a.arena);
        reg.release(&plain.arena, &[0]).unwrap();
        assert!(!plain.path.exists());
        // The pool is bounded.
        for i in 0..SPARE_ARENAS + 2 {
            let r = fill(&reg, (i + 1) * SPARE_ROUND + 1, 6, true);
            reg.release(&r.arena, &[0]).unwrap();
        }
        assert!(reg.spare.lock().len() <= SPARE_ARENAS);
    }

    #[test]
    fn spare_arenas_expire_unused() {
        let dir = tempfile::tempdir().unwrap();
        let reg = ShmRegistry::new(dir.path().into(), 0o600, Duration::from_millis(50));
        let (_, r) = reg
            .one_shot_with(10, true, |_| Ok::<_, ShmError>(()))
            .unwrap();
        reg.release(&r.arena, &[0]).unwrap();
        assert!(r.path.exists());
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(reg.open_arenas(), 0);
        assert!(!r.path.exists());
    }

    #[test]
    fn stale_files_of_dead_daemons_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        // pid 0 is never a user process; our own pid is alive.
        std::fs::write(dir.path().join("vserve-0-abc"), b"x").unwrap();
        let mine = format!("vserve-{}-abc", std::process::id());
        std::fs::write(dir.path().join(&mine), b"x").unwrap();
        std::fs::write(dir.path().join("other-file"), b"x").unwrap();
        let reg = ShmRegistry::new(dir.path().into(), 0o600, Duration::from_secs(60));
        assert_eq!(reg.remove_stale(), 1);
        assert!(dir.path().join(&mine).exists());
        assert!(dir.path().join("other-file").exists());
    }
}
