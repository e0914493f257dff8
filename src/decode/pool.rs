//! Reused frame buffers: decoders take a converted frame's bytes from here ([`take`]), and a frame's
//! buffer comes back when its last reference drops (`Drop for Frame`): a frame that bypassed the cache
//! once its batch is assembled, a cached frame when the cache evicts it. A reused buffer's pages are
//! already mapped, so neither a scan that decodes a video's every frame nor a cache that is full and
//! turning over pays a fresh allocation and the kernel's page zeroing per frame.
//!
//! Input: buffers given back, by their capacity. Output: a cleared buffer (`len() == 0`) of at least the
//! capacity asked, reused when one of exactly that capacity is free (frames of one geometry share a
//! size), else newly allocated. Invariants: the pool never holds more than [`POOL_BYTES`] (buffers
//! beyond it are freed); it keeps only capacities among the last [`SIZES`] distinct sizes decoders asked
//! for (a buffer of a size nobody decodes any more is freed, not kept); it never hands out a buffer still
//! referenced (buffers come back only from a frame's drop). Its content is stale bytes of an earlier
//! frame: takers overwrite every byte they keep.

use std::collections::{HashMap, VecDeque};
use std::sync::OnceLock;

use parking_lot::Mutex;

/// The most bytes of free buffers kept for reuse (the frames of about one in-flight scan request of
/// 340x256 video; larger frames are fewer of them).
pub const POOL_BYTES: usize = 128 << 20;

/// Distinct buffer sizes kept: the sizes of the latest [`take`]s, most recent first.
pub const SIZES: usize = 16;

#[derive(Default)]
struct Pool {
    /// Free buffers by capacity.
    free: HashMap<usize, Vec<Vec<u8>>>,
    /// Capacities asked for lately, most recent first (at most [`SIZES`]).
    wanted: VecDeque<usize>,
    bytes: usize,
}

impl Pool {
    fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        self.want(len);
        let buf = self.free.get_mut(&len).and_then(Vec::pop)?;
        self.bytes -= buf.capacity();
        Some(buf)
    }

    /// Keeps `buf` when its size is wanted and it fits the bound; gives it back otherwise (to be freed
    /// outside the lock).
    fn give(&mut self, buf: Vec<u8>) -> Option<Vec<u8>> {
        let cap = buf.capacity();
        if cap == 0 || self.bytes + cap > POOL_BYTES || !self.wanted.contains(&cap) {
            return Some(buf);
        }
        self.bytes += cap;
        self.free.entry(cap).or_default().push(buf);
        None
    }

    /// Marks `len` as wanted; a size pushed out of the list frees its buffers.
    fn want(&mut self, len: usize) {
        if self.wanted.front() == Some(&len) {
            return;
        }
        if let Some(i) = self.wanted.iter().position(|&w| w == len) {
            self.wanted.remove(i);
        }
        self.wanted.push_front(len);
        if self.wanted.len() > SIZES {
            if let Some(old) = self.wanted.pop_back() {
                let freed = self.free.remove(&old).unwrap_or_default();
                self.bytes -= freed.iter().map(Vec::capacity).sum::<usize>();
            }
        }
    }
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(|| Mutex::new(Pool::default()))
}

/// A cleared buffer with room for `len` bytes: a reused one of exactly that capacity when free.
pub fn take(len: usize) -> Vec<u8> {
    let reused = pool().lock().take(len);
    match reused {
        Some(mut buf) => {
            buf.clear();
            buf
        }
        None => Vec::with_capacity(len),
    }
}

/// Keeps `buf` for a later [`take`] of its capacity, when that size is wanted and within
/// [`POOL_BYTES`]; frees it otherwise.
pub fn give(buf: Vec<u8>) {
    if buf.capacity() == 0 {
        return; // every frame's drop comes here, also frames whose buffer was taken or never had one
    }
    let refused = pool().lock().give(buf);
    drop(refused); // freed outside the lock
}

/// Bytes of free buffers held now.
pub fn held_bytes() -> usize {
    pool().lock().bytes
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::decode::Frame;

    fn frame(len: usize, v: u8) -> Arc<Frame> {
        let mut data = take(len);
        data.resize(len, v);
        Arc::new(Frame {
            width: (len / 3) as u32,
            height: 1,
            data,
        })
    }

    #[test]
    fn a_frame_buffer_comes_back_at_its_last_reference_and_is_handed_out_again() {
        // A capacity no other test uses, so buffers of parallel tests do not interfere.
        let len = 3 * 7919;
        let (a, b) = (frame(len, 1), frame(len, 2));
        let held = a.clone(); // still referenced elsewhere (the cache)
        let ptr_a = a.data.as_ptr();
        let ptr_b = b.data.as_ptr();
        let b2 = b.clone();
        drop(a);
        drop(b);
        assert_eq!(held.data[0], 1, "a is still held: its bytes are untouched");
        assert_eq!(b2.data[0], 2);
        drop(b2); // b's last reference
        let again = take(len);
        assert_eq!(again.as_ptr(), ptr_b, "b's buffer is reused");
        assert!(again.is_empty() && again.capacity() >= len);
        drop(held); // a's last reference (the cache evicting it)
        let next = take(len);
        assert_eq!(next.as_ptr(), ptr_a, "a's buffer is reused once evicted");
        give(again);
        give(next);
        assert!(held_bytes() >= 2 * len);
        // Beyond the bound, buffers are freed rather than kept.
        let before = held_bytes();
        let big = POOL_BYTES + 1;
        drop(take(big)); // wanted, but too large to keep
        give(Vec::with_capacity(big));
        assert_eq!(held_bytes(), before);
    }

    #[test]
    fn only_wanted_sizes_within_the_bound_are_kept() {
        let mut p = Pool::default();
        // Never asked for (a frame built from a plain vector): refused.
        assert!(p.give(Vec::with_capacity(300)).is_some());
        assert_eq!(p.bytes, 0);
        // Asked for: kept, then handed out again (the same allocation).
        assert!(p.take(300).is_none());
        let buf = Vec::<u8>::with_capacity(300);
        let ptr = buf.as_ptr();
        assert!(p.give(buf).is_none());
        assert_eq!(p.bytes, 300);
        assert_eq!(p.take(300).map(|b| b.as_ptr()), Some(ptr));
        assert_eq!(p.bytes, 0);
        // Beyond the bound: refused.
        assert!(p.take(POOL_BYTES + 1).is_none());
        assert!(p.give(Vec::with_capacity(POOL_BYTES + 1)).is_some());
        // A size pushed out by SIZES newer ones loses its free buffers (POOL_BYTES + 1 is one of them).
        assert!(p.give(Vec::with_capacity(300)).is_none());
        for k in 0..SIZES - 2 {
            p.take(1000 + k);
            assert!(
                p.wanted.contains(&300),
                "still among the last {SIZES} sizes"
            );
        }
        p.take(5000);
        assert!(!p.wanted.contains(&300));
        assert!(!p.free.contains_key(&300));
        assert_eq!(p.bytes, 0);
        assert!(p.give(Vec::with_capacity(300)).is_some());
    }
}
