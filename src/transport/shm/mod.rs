//! Shared-memory arenas: files under the shm directory (default /dev/shm) holding batch bytes for clients
//! on the daemon's host.
//!
//! Input: batches' bytes and the [`Peer`] that asked. Output: [`ShmRef`]s (file, slot, offset) the api
//! puts in the batch header instead of the bytes.
//!
//! - A stream owns one arena of `slots` equal slots, created at its first batch. A slot is written only
//!   after the client released it ([`Arena::acquire`] waits), so a client's mapped view never changes under
//!   it until it says so; a client that releases nothing stalls only its own stream.
//! - A GetClips reply gets a one-slot arena, removed when released or, unreleased, after the registry's
//!   time to live.
//! - **Ownership.** Every arena belongs to the peer that asked for it: only that peer may release its
//!   slots ([`ShmError::NotOwner`] otherwise). Files live in this instance's own directory
//!   (`vserve-<pid>-<random>`, mode 0710, 0711 for a root daemon: the group, or everyone for a root
//!   daemon, may open a file it knows the name of, nobody but the daemon may list it) under unguessable names (128 random bits, sent only to the owner). A file is
//!   0600 when the owner runs as the daemon's user (or the daemon, as root, gives it to the owner's uid);
//!   otherwise 0640 for the daemon's group.
//! - **Reclaim.** A reaper runs every second ([`ShmRegistry::reap`]): arenas whose owning process has
//!   exited are dropped at once, and unreleased replies after the time to live, with no further request
//!   needed.
//! - **Budget.** Arena bytes count against a global limit and a per-client one; before a file is made the
//!   shm directory's free space is checked and the file's pages are allocated (`posix_fallocate`), so a
//!   full tmpfs is RESOURCE_EXHAUSTED for that request, never a SIGBUS for the daemon; nor is a file its
//!   client truncated under a write ([`sigbus`]: that call alone fails).
//! - **Instances.** Each daemon holds an exclusive `flock` on its directory's `.lock` for its whole life.
//!   At start-up, directories whose lock nobody holds (their daemon is gone, whatever its pid was) are
//!   removed; a running instance's are never touched. Files of the older layout (`vserve-<pid>-<hex>` at
//!   the top level) are removed when that pid is not running.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::peer::{Peer, PeerKey};

mod arena;
#[cfg(test)]
mod budget_tests;
mod dir;
#[cfg(test)]
mod lease_tests;
mod pending;
mod sigbus;
mod streams;
mod sweep;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use arena::index as slot_index;
pub use arena::{filesystem_bytes, Arena};
use arena::{random_hex, Access};
pub use pending::PendingReply;
pub use streams::SlotHold;

/// Released reusable GetClips arenas kept for later replies: at least this many may be kept, more while
/// clients keep more reusable replies in flight at once (pipelining), up to [`MAX_SPARE_ARENAS`]...
pub const SPARE_ARENAS: usize = 4;
/// ... holding at most this many bytes together, or as many as the reusable replies in flight held at
/// their peak, but never more than half of the shared-memory budget (`--shm-bytes`).
pub const SPARE_BYTES: usize = 512 << 20;
/// The most spare arenas kept, however many replies were in flight.
pub const MAX_SPARE_ARENAS: usize = 64;
/// Reusable GetClips arenas are sized in multiples of this, so replies of similar sizes share them.
pub const SPARE_ROUND: usize = 1 << 20;
/// How often the reaper looks for arenas of exited clients and expired replies.
pub const REAP_EVERY: Duration = Duration::from_secs(1);

/// Where a batch's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmRef {
    pub path: PathBuf,
    pub arena: String,
    pub slot: u32,
    pub offset: u64,
    pub arena_bytes: u64,
    /// How many slots the arena has.
    pub slots: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("cannot create shared-memory arena {path}: {reason}")]
    Create { path: String, reason: String },
    #[error("{nbytes} bytes do not fit a slot of {slot_bytes}")]
    TooLarge { nbytes: usize, slot_bytes: usize },
    #[error("no shared-memory arena {0:?} (released, expired, or not this daemon's)")]
    UnknownArena(String),
    #[error("arena {arena:?} was truncated by its client while the daemon wrote a batch into it: that batch is lost, and the arena is not used again (a client must never write to, truncate or open for writing its arena files)")]
    Truncated { arena: String },
    #[error("arena {arena:?} has no slot {slot}")]
    BadSlot { arena: String, slot: u32 },
    #[error("arena {arena:?} belongs to another client ({caller} may release only its own)")]
    NotOwner { arena: String, caller: String },
    #[error("shared memory full: {needed} bytes needed, {available} free in {dir}")]
    NoSpace {
        needed: u64,
        available: u64,
        dir: String,
    },
    #[error("shared-memory budget: {needed} bytes needed, {used} of {limit} in use by {whose}; release slots or retry later")]
    Budget {
        needed: usize,
        used: usize,
        limit: usize,
        whose: String,
    },
}

/// A GetClips reply's arena until released: (arena, when it was sent, whether the client lets it be
/// reused after releasing it).
type OneShot = (Arc<Arena>, Instant, bool);

/// Byte limits of a registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmBudget {
    /// All arenas together.
    pub total: usize,
    /// The arenas of one client.
    pub per_client: usize,
}

/// The daemon's arenas: streams' (weakly: a stream's end drops its arena) and GetClips' one-shot ones
/// (held until released or expired).
pub struct ShmRegistry {
    /// This instance's directory, inside the configured shm directory.
    dir: PathBuf,
    /// The configured shm directory (where other instances' directories are).
    parent: PathBuf,
    /// Held for the registry's life: its `flock` tells other instances this directory is in use
    /// (replaced when the directory is made again, `dir.rs`).
    lock: Mutex<Option<std::fs::File>>,
    ttl: Duration,
    budget: ShmBudget,
    /// Bytes of every arena file alive.
    live: Arc<AtomicUsize>,
    streams: Mutex<HashMap<String, Weak<Arena>>>,
    /// GetClips replies not released yet.
    one_shot: Mutex<HashMap<String, OneShot>>,
    /// GetClips replies taken and not published yet (decoders write into them; weakly: an abandoned
    /// one goes with its last writer). Counted in their owner's budget like published ones.
    pending: Mutex<HashMap<String, Weak<Arena>>>,
    /// Released reusable GetClips arenas, ready for the next reply that fits (bounded by
    /// [`ShmRegistry::spare_bounds`]; each dropped after the time to live unused).
    spare: Mutex<Vec<(Arc<Arena>, Instant)>>,
    /// The most reusable replies unreleased at once, and their bytes, since the spare pool last ran
    /// empty: the spare pool may keep that many, so a client pipelining N requests finds N arenas.
    reusable_peak: Mutex<(usize, usize)>,
    /// Arenas of streams that ended with slots the client has not released yet: kept until it does,
    /// or for the time to live, or until the client exits.
    retired: Mutex<HashMap<String, (Arc<Arena>, Instant)>>,
    /// Arenas of ended streams, every slot released, for the next stream of their shape (`streams.rs`).
    stream_spare: Mutex<Vec<(Arc<Arena>, Instant)>>,
    /// The most bytes stream arenas held at once since the pool last ran empty: what it may keep.
    stream_peak: Mutex<usize>,
    /// Held from an arena's admission until it is registered where [`ShmRegistry::bytes_of`] counts
    /// it: concurrent admissions of one client each missed the others' arenas, and 16 requests at once
    /// overshot its budget by up to 15 arenas.
    admitting: Mutex<()>,
}

impl Drop for ShmRegistry {
    fn drop(&mut self) {
        self.one_shot.lock().clear();
        self.spare.lock().clear();
        self.retired.lock().clear();
        self.stream_spare.lock().clear();
        // Arenas still referenced elsewhere (a reply a decode thread left at shutdown still writes
        // into) would remove their files only when dropped, which a process exiting never does: left
        // behind without the lock, no later daemon's sweep could tell them stale. They go now; whoever
        // maps one keeps its pages until unmapping.
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with("vserve-"))
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let _ = std::fs::remove_file(self.dir.join(".lock"));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl ShmRegistry {
    /// Opens this instance's directory under `parent` (created 0710, 0711 as root, and locked).
    pub fn new(parent: PathBuf, ttl: Duration, budget: ShmBudget) -> Result<ShmRegistry, ShmError> {
        let name = format!("vserve-{}-{}", std::process::id(), random_hex());
        let dir = parent.join(&name);
        let lock = dir::make_locked(&parent, &dir).map_err(|e| ShmError::Create {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(ShmRegistry {
            dir,
            parent,
            lock: Mutex::new(Some(lock)),
            ttl,
            budget,
            live: Arc::new(AtomicUsize::new(0)),
            streams: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            one_shot: Mutex::new(HashMap::new()),
            spare: Mutex::new(Vec::new()),
            reusable_peak: Mutex::new((0, 0)),
            retired: Mutex::new(HashMap::new()),
            stream_spare: Mutex::new(Vec::new()),
            stream_peak: Mutex::new(0),
            admitting: Mutex::new(()),
        })
    }

    /// This instance's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn budget(&self) -> ShmBudget {
        self.budget
    }

    /// The mode (and new owner) of a file for `owner`: private to it where the kernel lets us say so (the
    /// Unix socket's credentials, or on loopback TCP the kernel's owner of the client's socket: a root
    /// daemon's 0640 root file was one no TCP client but root could open).
    fn access_for(&self, owner: &Peer) -> Access {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        match owner.user() {
            Some(uid) if uid == euid => (0o600, None),
            Some(uid) if euid == 0 => (0o600, Some(uid)),
            _ => (0o640, None),
        }
    }

    /// Bytes of arenas `owner` holds now (streams', replies', retired).
    fn bytes_of(&self, owner: &PeerKey) -> usize {
        // Arenas held weakly (streams', replies being decoded into) count while alive.
        let held = |map: &Mutex<HashMap<String, Weak<Arena>>>| -> usize {
            map.lock()
                .values()
                .filter_map(Weak::upgrade)
                .filter(|a| &a.owner_key() == owner)
                .map(|a| a.bytes())
                .sum()
        };
        let streams = held(&self.streams);
        let one_shot: usize = self
            .one_shot
            .lock()
            .values()
            .filter(|(a, _, _)| &a.owner_key() == owner)
            .map(|(a, _, _)| a.bytes())
            .sum();
        let pending = held(&self.pending);
        let retired: usize = self
            .retired
            .lock()
            .iter()
            .filter(|(k, (a, _))| {
                &a.owner_key() == owner && !self.streams.lock().contains_key(k.as_str())
            })
            .map(|(_, (a, _))| a.bytes())
            .sum();
        streams + one_shot + pending + retired
    }

    /// Whether `owner`'s `method` must be answered inline because `nbytes` of shared memory (one reply,
    /// or one stream's arena) is more than its budgets could ever hold, whatever is released: logged a
    /// minute per client. (With a 64 MiB /dev/shm, Docker's default, such a stream was refused with
    /// "release slots or retry later", which nothing could make true: probe G.)
    pub fn inline_instead(&self, nbytes: usize, owner: &Peer, method: &'static str) -> bool {
        let limit = if nbytes > self.budget.per_client {
            ("--client-shm-bytes", self.budget.per_client)
        } else if nbytes > self.budget.total {
            ("--shm-bytes", self.budget.total)
        } else {
            return false;
        };
        let client = owner.describe();
        let log = crate::refusal::RefusalLog::minutely();
        if let Some(suppressed) = log.note_at(&client, "shm-too-small", Instant::now()) {
            tracing::warn!(
                method,
                client,
                suppressed,
                needed = nbytes,
                limit = limit.1,
                "shared memory asked for more than {} allows even with nothing else held: answering inline (raise it, or the shm filesystem's size it defaults from)",
                limit.0
            );
        }
        true
    }

    /// Refuses `nbytes` more for `owner` beyond the budgets (spare arenas are given up first).
    fn admit(&self, nbytes: usize, owner: &Peer) -> Result<(), ShmError> {
        let mine = self.bytes_of(&owner.key);
        if mine + nbytes > self.budget.per_client {
            return Err(ShmError::Budget {
                needed: nbytes,
                used: mine,
                limit: self.budget.per_client,
                whose: format!(
                    "{} (per-client limit, --client-shm-bytes)",
                    owner.describe()
                ),
            });
        }
        let over = |live: usize| live + nbytes > self.budget.total;
        if over(self.live.load(Ordering::Relaxed)) {
            self.spare.lock().clear();
            self.stream_spare.lock().clear();
        }
        let live = self.live.load(Ordering::Relaxed);
        if over(live) {
            return Err(ShmError::Budget {
                needed: nbytes,
                used: live,
                limit: self.budget.total,
                whose: "all clients (--shm-bytes)".into(),
            });
        }
        Ok(())
    }

    fn create(&self, slot_bytes: usize, slots: usize, owner: &Peer) -> Result<Arena, ShmError> {
        self.admit(slot_bytes.max(1) * slots.max(1), owner)?;
        Arena::create(
            &self.dir,
            self.access_for(owner),
            slot_bytes,
            slots,
            owner,
            self.live.clone(),
        )
    }

    /// Puts one reply's bytes in a one-slot arena kept until released or expired.
    pub fn one_shot(&self, data: &[u8], owner: &Peer) -> Result<ShmRef, ShmError> {
        self.one_shot_with(data.len(), false, owner, |buf| {
            buf.copy_from_slice(data);
            Ok::<_, ShmError>(())
        })
        .map(|((), r)| r)
    }

    /// A one-slot arena of `nbytes` that `f` fills in place (a reply assembled straight into shared
    /// memory, with no intermediate buffer), owned by `owner`, kept until released or expired; nothing is
    /// kept if `f` fails.
    ///
    /// `reusable`: the client releases the slot only once it reads nothing of it any more, so after the
    /// release the arena goes to the spare pool and a later reusable reply that fits takes it (its pages
    /// are already there: no new file, no zero-filling). Such arenas are made a little larger than asked
    /// (rounded up to [`SPARE_ROUND`]) so that replies of similar sizes share them.
    pub fn one_shot_with<T, E>(
        &self,
        nbytes: usize,
        reusable: bool,
        owner: &Peer,
        f: impl FnOnce(&mut [u8]) -> Result<T, E>,
    ) -> Result<(T, ShmRef), E>
    where
        E: From<ShmError>,
    {
        let reply = self.reserve_reply(nbytes, reusable, owner)?;
        // SAFETY: the reply was just taken and is shared with nobody.
        match unsafe { reply.with_bytes(f) } {
            Ok(v) => Ok((v, self.publish(&reply, reusable)?)),
            Err(e) => {
                self.abandon(reply, reusable);
                Err(e)
            }
        }
    }

    /// How many spare arenas, and how many bytes of them, the pool keeps at most now: as many as the
    /// reusable replies in flight at their peak (at least [`SPARE_ARENAS`] and [`SPARE_BYTES`]), at
    /// most [`MAX_SPARE_ARENAS`] and half of the shared-memory budget.
    pub fn spare_bounds(&self) -> (usize, usize) {
        let (count, bytes) = *self.reusable_peak.lock();
        (
            count.clamp(SPARE_ARENAS, MAX_SPARE_ARENAS),
            bytes.max(SPARE_BYTES).min(self.budget.total / 2),
        )
    }

    /// Spare arenas held now (for tests and stats).
    pub fn spare_arenas(&self) -> usize {
        self.spare.lock().len()
    }

    /// The smallest spare arena that holds `nbytes` without wasting more than half of itself and whose
    /// file `owner` may open; it becomes `owner`'s.
    fn take_spare(&self, nbytes: usize, owner: &Peer) -> Option<Arc<Arena>> {
        if self.spare.lock().is_empty() {
            return None; // (before counting the owner's bytes, a walk of every arena)
        }
        let access = self.access_for(owner);
        // A pooled arena lent counts against its new owner as a new one would.
        let room = self
            .budget
            .per_client
            .saturating_sub(self.bytes_of(&owner.key));
        let mut spare = self.spare.lock();
        let fits = |a: &Arena| {
            lends_to(a, access, owner)
                && a.slot_bytes >= nbytes
                && a.slot_bytes / 2 <= nbytes.max(SPARE_ROUND)
                && a.bytes() <= room
        };
        let best = spare
            .iter()
            .enumerate()
            .filter(|(_, (a, _))| fits(a))
            .min_by_key(|(_, (a, _))| a.slot_bytes)
            .map(|(i, _)| i)?;
        let arena = spare.swap_remove(best).0;
        *arena.owner.lock() = owner.clone();
        Some(arena)
    }

    /// Keeps a released reusable arena for later replies, within the pool's bounds (the newest stay).
    fn put_spare(&self, arena: Arc<Arena>) {
        if !arena.linked() {
            return;
        }
        let (most, most_bytes) = self.spare_bounds();
        keep_newest(&self.spare, arena, most, most_bytes);
    }

    /// Drops one-shot and retired arenas older than the time to live, and spare ones unused that long.
    /// (An expired one-shot reply is dropped, never pooled: its client may still be reading it.)
    pub fn expire(&self) {
        let ttl = self.ttl;
        let in_flight = {
            let mut one_shot = self.one_shot.lock();
            one_shot.retain(|_, (_, at, _)| at.elapsed() < ttl);
            reusable_in_flight(&one_shot)
        };
        let mut spare = self.spare.lock();
        spare.retain(|(_, at)| at.elapsed() < ttl);
        if spare.is_empty() {
            // Nobody reused a spare for a whole time to live: the peak starts again from what is in
            // flight now, so a pipelining client that left does not keep the pool large.
            *self.reusable_peak.lock() = in_flight;
        }
        drop(spare);
        self.retired.lock().retain(|_, (_, at)| at.elapsed() < ttl);
        self.expire_stream_spares();
    }

    /// The reaper's round: expires by time, and drops the replies and retired stream arenas of clients
    /// whose process has exited (their streams end by themselves when the connection goes). Returns how
    /// many arenas were dropped for exited clients.
    pub fn reap(&self) -> usize {
        self.expire();
        let mut verdicts: HashMap<PeerKey, bool> = HashMap::new();
        let mut gone = |a: &Arena| {
            let owner = a.owner.lock().clone();
            *verdicts
                .entry(owner.key.clone())
                .or_insert_with(|| owner.is_alive() == Some(false))
        };
        let mut dropped = 0;
        self.one_shot.lock().retain(|_, (a, _, _)| {
            let keep = !gone(a);
            dropped += usize::from(!keep);
            keep
        });
        self.retired.lock().retain(|_, (a, _)| {
            let keep = !gone(a);
            dropped += usize::from(!keep);
            keep
        });
        dropped
    }

    /// Runs [`ShmRegistry::reap`] every [`REAP_EVERY`] on a named thread until the registry is dropped.
    pub fn start_reaper(registry: &Arc<ShmRegistry>) {
        let weak = Arc::downgrade(registry);
        let spawned = std::thread::Builder::new()
            .name("vserve-shm-reaper".into())
            .spawn(move || loop {
                std::thread::sleep(REAP_EVERY);
                let Some(reg) = weak.upgrade() else { return };
                let n = reg.reap();
                if n > 0 {
                    tracing::info!(
                        arenas = n,
                        "released the shared memory of clients that exited"
                    );
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no shared-memory reaper thread: unreleased arenas expire only on later requests");
        }
    }

    /// A stream ended: its arena stays until the client has released every slot (it may not have read
    /// the last batches yet), for the time to live, or until the client exits; then, released, it goes to
    /// the pool for the next stream of its shape.
    pub fn retire(&self, arena: Arc<Arena>) {
        if arena.all_free() && Arc::strong_count(&arena) == 1 {
            self.pool_stream_arena(arena);
            return;
        }
        if arena.owner.lock().is_alive() == Some(false) {
            return;
        }
        self.retired
            .lock()
            .insert(arena.name.clone(), (arena, Instant::now()));
    }

    /// Frees `slots` of `arena` for `by`, which must own it.
    pub fn release(&self, arena: &str, slots: &[u32], by: &Peer) -> Result<(), ShmError> {
        let not_owner = || ShmError::NotOwner {
            arena: arena.to_owned(),
            caller: by.describe(),
        };
        {
            let mut one_shot = self.one_shot.lock();
            if let Some((a, _, reusable)) = one_shot.get(arena) {
                match may_release(a, by) {
                    Releaser::Owner => {}
                    Releaser::OwnerGone => return Ok(()),
                    Releaser::Other => return Err(not_owner()),
                }
                let (a, reusable) = (a.clone(), *reusable);
                if a.release(slots)? == 0 {
                    // An earlier reply's release, sent twice or late: this arena now holds a later
                    // reply (lent to it), which stays.
                    return Ok(());
                }
                one_shot.remove(arena);
                drop(one_shot);
                if reusable && a.all_free() {
                    self.put_spare(a);
                }
                return Ok(());
            }
        }
        let retired = self.retired.lock().get(arena).map(|(a, _)| a.clone());
        if let Some(a) = retired {
            match may_release(&a, by) {
                Releaser::Owner => {}
                Releaser::OwnerGone => return Ok(()),
                Releaser::Other => return Err(not_owner()),
            }
            a.release(slots)?;
            if a.all_free() {
                self.retired.lock().remove(arena);
                self.pool_stream_arena(a);
            }
            return Ok(());
        }
        let found = self.streams.lock().get(arena).and_then(Weak::upgrade);
        match found {
            Some(a) => match may_release(&a, by) {
                Releaser::Owner => a.release(slots).map(drop),
                Releaser::OwnerGone => Ok(()),
                Releaser::Other => Err(not_owner()),
            },
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
        let pending = {
            let mut p = self.pending.lock();
            p.retain(|_, w| w.strong_count() > 0);
            p.len()
        };
        (streams
            + self.one_shot.lock().len()
            + pending
            + self.spare.lock().len()
            + self.stream_spare.lock().len()
            + retired_only) as u64
    }

    /// Bytes of every arena file alive now.
    pub fn bytes_in_use(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

/// Who is asking to release an arena's slots.
#[derive(Debug, PartialEq, Eq)]
enum Releaser {
    /// Its owner: the release goes ahead.
    Owner,
    /// A caller known only by its uid (its process has just exited, so the kernel's pid no longer
    /// names a process the daemon can see) of the same user as an owner that has exited: almost
    /// certainly the owner's last release, sent as it exited. Nothing to do: the reaper removes the
    /// arena within a second. Answered OK, so a client exiting is not told PERMISSION_DENIED.
    OwnerGone,
    /// Anyone else: PERMISSION_DENIED.
    Other,
}

/// Keeps `arena` in `pool` (a pool of spare arenas, newest last) unless it alone holds more than
/// `most_bytes`, then drops the oldest while the pool holds more than `most` arenas or `most_bytes`.
fn keep_newest(
    pool: &Mutex<Vec<(Arc<Arena>, Instant)>>,
    arena: Arc<Arena>,
    most: usize,
    most_bytes: usize,
) {
    if arena.bytes() > most_bytes || arena.intact().is_err() {
        return;
    }
    let mut pool = pool.lock();
    pool.push((arena, Instant::now()));
    while pool.len() > most || pool.iter().map(|(a, _)| a.bytes()).sum::<usize>() > most_bytes {
        pool.remove(0);
    }
}

/// Whether a spare arena may go to `to`, whose files open as `access`: the file must open the same way, and
/// since whoever held the arena before knows its name, only a client of the same user (who could read that
/// user's memory anyway) takes it: by the Unix socket's credentials, or on loopback TCP by the kernel's
/// owner of the client's socket. Other clients without a uid (remote TCP) take only the spares of
/// in-process calls, never another client's.
fn lends_to(a: &Arena, access: Access, to: &Peer) -> bool {
    if a.access != access {
        return false;
    }
    let before = a.owner.lock();
    match (before.user(), to.user()) {
        (Some(b), Some(t)) => b == t,
        _ => before.key == PeerKey::Local && to.key == PeerKey::Local,
    }
}

fn may_release(a: &Arena, by: &Peer) -> Releaser {
    let owner = a.owner.lock().clone();
    if owner.key == by.key {
        return Releaser::Owner;
    }
    match (&by.key, owner.uid) {
        (PeerKey::User(uid), Some(owner_uid))
            if *uid == owner_uid && owner.is_alive() == Some(false) =>
        {
            Releaser::OwnerGone
        }
        _ => Releaser::Other,
    }
}

/// Reusable GetClips replies not released yet, and their arenas' bytes.
fn reusable_in_flight(one_shot: &HashMap<String, OneShot>) -> (usize, usize) {
    one_shot
        .values()
        .filter(|(_, _, reusable)| *reusable)
        .fold((0, 0), |(n, b), (a, _, _)| (n + 1, b + a.slot_bytes))
}
