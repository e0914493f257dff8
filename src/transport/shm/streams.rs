//! Stream arenas kept across streams: a training job opens a stream per rank per epoch, each with an
//! arena of `prefetch + 3` batch slots (192 MB at 32 clips of 8 224x224 frames, prefetch 2). Made anew,
//! each is a new file whose pages the kernel allocates and zeroes (`posix_fallocate`), the daemon faults in
//! as it writes the first batches, and the client faults in again as it reads them. A stream that ends
//! with every slot released hands its arena to a pool here, and the next stream of the same shape (slot
//! size and count) of a client of the same user takes it (see `lends_to`: the earlier owner knows the
//! file's name): no new file, its pages already there.
//!
//! Bounds: the pool holds at most as many bytes as stream arenas held at once at their peak (it never
//! makes the daemon hold more shared memory than its streams did), never more than half of the budget
//! (`--shm-bytes`) nor [`MAX_SPARE_ARENAS`] arenas; each goes after the time to live unused, and all of
//! them when a new arena would not fit the budget otherwise. A pooled arena belongs to nobody: it counts in
//! no client's budget until a stream takes it, and only that stream's client may release its slots.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use super::{keep_newest, lends_to, Arena, ShmError, ShmRegistry, MAX_SPARE_ARENAS};
use crate::peer::Peer;

impl ShmRegistry {
    /// A stream's arena of `slots` slots of `slot_bytes`, owned by `owner`: a pooled one of that shape
    /// when there is one `owner` may open (and its budget holds), else a new file. Dropped with the last
    /// reference, or pooled at the stream's end (see [`ShmRegistry::retire`]).
    pub fn stream_arena(
        &self,
        slot_bytes: usize,
        slots: usize,
        owner: &Peer,
    ) -> Result<Arc<Arena>, ShmError> {
        self.expire();
        self.ensure_dir()?;
        let admitting = self.admitting.lock();
        let arena = match self.take_stream_spare(slot_bytes, slots, owner) {
            Some(a) => a,
            None => Arc::new(self.create(slot_bytes, slots, owner)?),
        };
        let mut map = self.streams.lock();
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(arena.name.clone(), Arc::downgrade(&arena));
        drop(admitting);
        let live = live_bytes(&map);
        let mut peak = self.stream_peak.lock();
        *peak = (*peak).max(live);
        Ok(arena)
    }

    /// Pooled stream arenas (for tests and stats).
    pub fn spare_stream_arenas(&self) -> usize {
        self.stream_spare.lock().len()
    }

    fn take_stream_spare(
        &self,
        slot_bytes: usize,
        slots: usize,
        owner: &Peer,
    ) -> Option<Arc<Arena>> {
        let access = self.access_for(owner);
        let arena = {
            let mut spare = self.stream_spare.lock();
            let i = spare.iter().position(|(a, _)| {
                lends_to(a, access, owner)
                    && a.slot_bytes == slot_bytes.max(1)
                    && a.slots() == slots.max(1)
            })?;
            spare.swap_remove(i).0
        };
        if self.bytes_of(&owner.key) + arena.bytes() > self.budget.per_client {
            // Dropped: the new arena's refusal names the budget.
            return None;
        }
        *arena.owner.lock() = owner.clone();
        tracing::debug!(arena = %arena.name, bytes = arena.bytes(), "stream reuses a pooled arena");
        Some(arena)
    }

    /// Pools a stream's arena once its stream has ended, its client has released every slot and nothing
    /// else holds it; otherwise lets it go.
    pub(super) fn pool_stream_arena(&self, arena: Arc<Arena>) {
        if !arena.all_free()
            || Arc::strong_count(&arena) != 1
            || arena.owner.lock().is_alive() == Some(false)
            || !arena.linked()
        {
            return;
        }
        self.streams.lock().remove(&arena.name);
        let most_bytes = (*self.stream_peak.lock()).min(self.budget.total / 2);
        keep_newest(&self.stream_spare, arena, MAX_SPARE_ARENAS, most_bytes);
    }

    /// Drops pooled stream arenas unused for the time to live; once none is left, the peak they are
    /// bounded by starts again from the stream arenas alive now.
    pub(super) fn expire_stream_spares(&self) {
        let mut spare = self.stream_spare.lock();
        spare.retain(|(_, at)| at.elapsed() < self.ttl);
        if spare.is_empty() {
            let live = live_bytes(&self.streams.lock());
            *self.stream_peak.lock() = live;
        }
    }
}

/// Bytes of the stream arenas still alive in the registry's table.
fn live_bytes(streams: &HashMap<String, Weak<Arena>>) -> usize {
    streams
        .values()
        .filter_map(Weak::upgrade)
        .map(|a| a.bytes())
        .sum()
}

/// A slot of a stream's arena taken for a batch not yet handed to its client: given back through the
/// registry (as the client's own release would be) if the batch is dropped first. A stream that stopped
/// early (a failed batch, a closed call, an idle client) dropped the batches it was still preparing with
/// their slots taken, and their arena, which waits for every slot, stayed retired and charged to the
/// client until its time to live.
pub struct SlotHold {
    /// None once handed (or released).
    held: Option<(Arc<ShmRegistry>, String, Peer)>,
    token: u32,
}

impl SlotHold {
    pub fn new(shm: &Arc<ShmRegistry>, arena: &Arena, token: u32, owner: &Peer) -> SlotHold {
        SlotHold {
            held: Some((shm.clone(), arena.name().to_owned(), owner.clone())),
            token,
        }
    }

    /// The batch is on its way to the client, who releases the slot from now on.
    pub fn handed(mut self) {
        self.held = None;
    }
}

impl std::fmt::Debug for SlotHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let arena = self.held.as_ref().map(|(_, a, _)| a.as_str());
        f.debug_struct("SlotHold")
            .field("arena", &arena)
            .field("token", &self.token)
            .finish()
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        if let Some((shm, arena, owner)) = self.held.take() {
            if let Err(e) = shm.release(&arena, &[self.token], &owner) {
                tracing::debug!(arena = %arena, error = %e, "slot of a batch never handed out: not released");
            }
        }
    }
}
