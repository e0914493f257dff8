//! A GetClips reply's arena taken before its bytes exist: decode threads convert frames into it (it is
//! the memory of their [`Sink`]s), the request fills the rest, then [`ShmRegistry::publish`] hands it to
//! the client. Unpublished (the request failed or was cancelled), its slot is freed and the arena goes
//! when the last holder does: a run still writing into it keeps it, so its bytes are never lent to
//! another reply under a late writer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{Arena, ShmRef, ShmRegistry};
use crate::decode::sink::{Sink, SinkMemory};

/// A reply arena's slot, taken and not yet published.
pub struct PendingReply {
    pub(super) arena: Arc<Arena>,
    pub(super) slot: u32,
    pub(super) nbytes: usize,
    pub(super) published: AtomicBool,
}

impl std::fmt::Debug for PendingReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingReply")
            .field("arena", &self.arena.name)
            .field("nbytes", &self.nbytes)
            .finish()
    }
}

impl PendingReply {
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Runs `f` on the reply's bytes.
    ///
    /// # Safety
    /// Nothing else may read or write the bytes meanwhile: every run given a [`Sink`] over this reply
    /// has returned (the request awaited their results) and no other `with_bytes` call is running.
    pub unsafe fn with_bytes<T>(&self, f: impl FnOnce(&mut [u8]) -> T) -> T {
        // SAFETY: the range lies inside the mapping (the slot was checked to hold `nbytes` when taken);
        // exclusivity is the caller's promise.
        f(unsafe { std::slice::from_raw_parts_mut(self.base(), self.nbytes) })
    }

    /// A sink over this reply for frames of `frame_bytes` at `(frame, offset)`.
    pub fn sink(
        self: &Arc<Self>,
        frame_bytes: usize,
        places: impl IntoIterator<Item = (usize, usize)>,
    ) -> Result<Sink, String> {
        Sink::new(self.clone(), frame_bytes, places)
    }

    fn slot_ref(&self) -> ShmRef {
        let offset = self.arena.offset(self.slot);
        ShmRef {
            path: self.arena.path.clone(),
            arena: self.arena.name.clone(),
            slot: self.slot,
            offset: offset as u64,
            arena_bytes: self.arena.map.len() as u64,
            slots: self.arena.slot_count(),
        }
    }
}

impl SinkMemory for PendingReply {
    fn base(&self) -> *mut u8 {
        // SAFETY: the slot's offset lies inside the mapping (checked when taken).
        unsafe {
            self.arena
                .map
                .as_mut_ptr()
                .add(self.arena.offset(self.slot))
        }
    }
    fn bytes(&self) -> usize {
        self.nbytes
    }
}

impl Drop for PendingReply {
    fn drop(&mut self) {
        if !self.published.load(Ordering::Acquire) {
            let _ = self.arena.release(&[self.slot]);
        }
    }
}

impl ShmRegistry {
    /// Takes a one-slot reply arena of `nbytes` for `owner` (a spare one when `reusable` and one fits,
    /// see [`ShmRegistry::one_shot_with`]), to be filled and then published.
    pub fn reserve_reply(
        &self,
        nbytes: usize,
        reusable: bool,
        owner: &crate::peer::Peer,
    ) -> Result<PendingReply, super::ShmError> {
        self.expire();
        self.ensure_dir()?;
        let admitting = self.admitting.lock();
        let arena = match reusable.then(|| self.take_spare(nbytes, owner)).flatten() {
            Some(a) => a,
            None => {
                let size = if reusable {
                    nbytes.div_ceil(super::SPARE_ROUND).max(1) * super::SPARE_ROUND
                } else {
                    nbytes
                };
                Arc::new(self.create(size, 1, owner)?)
            }
        };
        let slot = arena
            .try_acquire()
            .ok_or_else(|| super::ShmError::BadSlot {
                arena: arena.name.clone(),
                slot: 0,
            })?;
        if nbytes > arena.slot_bytes {
            let _ = arena.release(&[slot]);
            return Err(super::ShmError::TooLarge {
                nbytes,
                slot_bytes: arena.slot_bytes,
            });
        }
        {
            let mut pending = self.pending.lock();
            pending.retain(|_, w| w.strong_count() > 0);
            pending.insert(arena.name.clone(), Arc::downgrade(&arena));
        }
        drop(admitting);
        Ok(PendingReply {
            arena,
            slot,
            nbytes,
            published: AtomicBool::new(false),
        })
    }

    /// Hands a filled reply to its client: kept until released or expired. `reusable` as when reserved.
    pub fn publish(&self, reply: &PendingReply, reusable: bool) -> Result<ShmRef, super::ShmError> {
        // A client that truncated the file lost these bytes: not announced (the slot is released when
        // the reply drops, and the arena never lent again).
        reply.arena.intact()?;
        reply.published.store(true, Ordering::Release);
        self.pending.lock().remove(&reply.arena.name);
        let mut one_shot = self.one_shot.lock();
        one_shot.insert(
            reply.arena.name.clone(),
            (reply.arena.clone(), std::time::Instant::now(), reusable),
        );
        if reusable {
            let now = super::reusable_in_flight(&one_shot);
            drop(one_shot);
            let mut peak = self.reusable_peak.lock();
            *peak = (peak.0.max(now.0), peak.1.max(now.1));
        }
        Ok(reply.slot_ref())
    }

    /// Gives up a reply nothing writes into any more: its slot is freed and a reusable arena goes back
    /// to the spare pool.
    pub(super) fn abandon(&self, reply: PendingReply, reusable: bool) {
        let _ = reply.arena.release(&[reply.slot]);
        reply.published.store(true, Ordering::Release);
        self.pending.lock().remove(&reply.arena.name);
        if reusable {
            self.put_spare(reply.arena.clone());
        }
    }
}
