//! One arena: a file of equal slots in the instance's shm directory, mapped into the daemon, with its
//! owner and its share of the byte budget. Slots are written only by whoever acquired them; the file is
//! removed and its bytes given back when the arena is dropped.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{ShmError, ShmRef};
use crate::peer::{Peer, PeerKey};

/// Who may open an arena's file: its mode and, when the daemon gives it away, the owner's uid.
pub(super) type Access = (u32, Option<u32>);

/// Bits of a slot token that number the slot; the bits above count the slot's leases (see
/// [`Arena::release`]).
const SLOT_BITS: u32 = 8;
/// Slots an arena may have.
pub(super) const MAX_SLOTS: usize = 1 << SLOT_BITS;
/// Leases of one slot before its count starts again (a token carries this many of them).
const LEASES: u32 = 1 << (32 - SLOT_BITS);

/// One slot: whether it is free to write, and how many times it was released (its current lease).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SlotState {
    taken: bool,
    lease: u32,
}

/// The slot a token names (whatever its lease).
pub(crate) fn index(token: u32) -> usize {
    (token & (MAX_SLOTS as u32 - 1)) as usize
}

/// A file of `slots` slots of `slot_bytes`, mapped into the daemon.
///
/// A slot is handed out as a token: its number plus the count of its earlier leases. The client
/// releases the token it was given, so a release sent twice, or late after the slot (or, for a reply
/// arena lent to the client's next reply, the arena) was taken again, names an earlier lease and frees
/// nothing: the slot's new holder keeps its bytes.
pub struct Arena {
    pub(super) name: String,
    pub(super) path: PathBuf,
    /// The mapping's SIGBUS guard (declared before `map`: unregistered before the unmap).
    pub(super) guard: super::sigbus::Watched,
    pub(super) map: memmap2::MmapRaw,
    pub(super) slot_bytes: usize,
    /// Per slot: taken or free, and its lease count.
    pub(super) slots: Mutex<Vec<SlotState>>,
    pub(super) released: Notify,
    /// The client that may release slots (changes when a spare arena is lent to another reply).
    pub(super) owner: Mutex<Peer>,
    pub(super) access: Access,
    /// The registry's count of arena bytes, decremented when this arena goes.
    pub(super) live: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("name", &self.name)
            .field("slot_bytes", &self.slot_bytes)
            .field("bytes", &self.map.len())
            .finish()
    }
}

// SAFETY: the mapping is written only through `write`, into a slot its caller acquired (owned exclusively
// until released); MmapRaw hands out raw pointers and holds no Rust references to the memory.
unsafe impl Sync for Arena {}

impl Arena {
    pub(super) fn create(
        dir: &Path,
        access: Access,
        slot_bytes: usize,
        slots: usize,
        owner: &Peer,
        live: Arc<AtomicUsize>,
    ) -> Result<Arena, ShmError> {
        let name = format!("vserve-{}", random_hex());
        let path = dir.join(&name);
        let err = |e: std::io::Error| ShmError::Create {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        if slots > MAX_SLOTS {
            return Err(ShmError::Create {
                path: path.display().to_string(),
                reason: format!("{slots} slots, at most {MAX_SLOTS}"),
            });
        }
        let total = slot_bytes.max(1) * slots.max(1);
        let available = free_bytes(dir).unwrap_or(u64::MAX);
        if total as u64 > available {
            return Err(ShmError::NoSpace {
                needed: total as u64,
                available,
                dir: dir.display().to_string(),
            });
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(access.0)
            .open(&path)
            .map_err(err)?;
        let made = (|| {
            if let Some(uid) = access.1 {
                std::os::unix::fs::fchown(&file, Some(uid), None)?;
            }
            allocate(&file, total as u64)?;
            memmap2::MmapRaw::map_raw(&file)
        })();
        let map = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                if e.raw_os_error() == Some(libc::ENOSPC) {
                    return Err(ShmError::NoSpace {
                        needed: total as u64,
                        available: free_bytes(dir).unwrap_or(0),
                        dir: dir.display().to_string(),
                    });
                }
                return Err(err(e));
            }
        };
        live.fetch_add(total, Ordering::Relaxed);
        let guard = super::sigbus::watch(map.as_mut_ptr(), map.len());
        Ok(Arena {
            name,
            path,
            guard,
            map,
            slot_bytes: slot_bytes.max(1),
            slots: Mutex::new(vec![SlotState::default(); slots.max(1)]),
            released: Notify::new(),
            owner: Mutex::new(owner.clone()),
            access,
            live,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the file still has the pages the daemon wrote: Err when its client truncated it under
    /// a write ([`super::sigbus`]; the bytes are gone, and the arena is never used again).
    pub fn intact(&self) -> Result<(), ShmError> {
        if super::sigbus::broken(&self.guard) {
            return Err(ShmError::Truncated {
                arena: self.name.clone(),
            });
        }
        Ok(())
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Bytes of the file.
    pub fn bytes(&self) -> usize {
        self.map.len()
    }

    pub(super) fn owner_key(&self) -> PeerKey {
        self.owner.lock().key.clone()
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

    /// Takes a free slot: its token.
    pub(crate) fn try_acquire(&self) -> Option<u32> {
        let mut slots = self.slots.lock();
        let i = slots.iter().position(|s| !s.taken)?;
        slots[i].taken = true;
        Some(slots[i].lease << SLOT_BITS | i as u32)
    }

    /// Whether the arena's file is still in the directory (it goes with the directory when someone
    /// removes that, `dir.rs`): an arena whose file is gone is never lent again.
    pub(super) fn linked(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok()
    }

    /// How many slots the arena has (its file is that many slots long).
    pub(super) fn slot_count(&self) -> u32 {
        (self.map.len() / self.slot_bytes.max(1)) as u32
    }

    /// Byte offset in the file of the slot a token names.
    pub(super) fn offset(&self, token: u32) -> usize {
        index(token) * self.slot_bytes
    }

    /// Copies `data` into a slot the caller acquired.
    pub fn write(&self, slot: u32, data: &[u8]) -> Result<ShmRef, ShmError> {
        if data.len() > self.slot_bytes {
            return Err(ShmError::TooLarge {
                nbytes: data.len(),
                slot_bytes: self.slot_bytes,
            });
        }
        let offset = self.offset(slot);
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
        self.intact()?;
        Ok(ShmRef {
            path: self.path.clone(),
            arena: self.name.clone(),
            slot,
            offset: offset as u64,
            arena_bytes: self.map.len() as u64,
            slots: self.slot_count(),
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
        let offset = self.offset(slot);
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
        match f(buf).and_then(|v| self.intact().map(|()| v).map_err(E::from)) {
            Ok(v) => Ok((
                v,
                ShmRef {
                    path: self.path.clone(),
                    arena: self.name.clone(),
                    slot,
                    offset: offset as u64,
                    arena_bytes: self.map.len() as u64,
                    slots: self.slot_count(),
                },
            )),
            Err(e) => {
                let _ = self.release(&[slot]);
                Err(e)
            }
        }
    }

    /// Frees the slots the tokens hold now: all of them, or (a token naming no slot of the arena) none.
    /// A token of an earlier lease (a release sent twice, or late after its slot was taken again) frees
    /// nothing. Returns how many slots were freed.
    pub(super) fn release(&self, tokens: &[u32]) -> Result<usize, ShmError> {
        let freed = {
            let mut slots = self.slots.lock();
            if let Some(&bad) = tokens.iter().find(|&&t| index(t) >= slots.len()) {
                return Err(ShmError::BadSlot {
                    arena: self.name.clone(),
                    slot: bad,
                });
            }
            let mut freed = 0;
            for &t in tokens {
                let s = &mut slots[index(t)];
                if s.taken && s.lease == t >> SLOT_BITS {
                    s.taken = false;
                    s.lease = (s.lease + 1) % LEASES;
                    freed += 1;
                }
            }
            freed
        };
        if freed > 0 {
            self.released.notify_waiters();
        } else {
            tracing::debug!(arena = %self.name, ?tokens, "release of slots no longer held: ignored");
        }
        Ok(freed)
    }

    /// Slots of the arena.
    pub(super) fn slots(&self) -> usize {
        self.slots.lock().len()
    }

    pub(super) fn all_free(&self) -> bool {
        self.slots.lock().iter().all(|s| !s.taken)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        self.live.fetch_sub(self.map.len(), Ordering::Relaxed);
    }
}

/// Free bytes of the filesystem holding `dir` (for an unprivileged writer).
pub(super) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes only into `st`, a plain struct we own; `c` is a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Size of the filesystem holding `dir`, for the default budget.
pub fn filesystem_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes only into `st`, a plain struct we own; `c` is a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_blocks as u64 * st.f_frsize as u64)
}

/// Gives the file `len` bytes backed by pages now, so a later write cannot fault on a full tmpfs.
/// Filesystems without fallocate get a sparse length (as before).
fn allocate(file: &std::fs::File, len: u64) -> std::io::Result<()> {
    // SAFETY: posix_fallocate on a descriptor we own; it returns an errno value and touches no memory of
    // ours.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    match rc {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// 128 random bits as hex, from the kernel's generator.
pub(super) fn random_hex() -> String {
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
