//! Reused frame buffers: decoders take a converted frame's bytes from here ([`take`]), and request
//! handlers give back, once a batch is assembled, the buffers of frames nobody else holds ([`recycle`]):
//! in practice the frames of runs that bypassed the cache (a cached frame is held by the cache). A
//! reused buffer's pages are already mapped, so a scan that decodes a video's every frame no longer pays
//! a fresh allocation and the kernel's page zeroing per frame.
//!
//! Input: buffers given back, by their capacity. Output: a cleared buffer (`len() == 0`) of at least the
//! capacity asked, reused when one of exactly that capacity is free (frames of one geometry share a
//! size), else newly allocated. Invariants: the pool never holds more than [`POOL_BYTES`] (buffers
//! beyond it are freed) and never hands out a buffer still referenced (only uniquely owned frames are
//! recycled). Its content is stale bytes of an earlier frame: takers overwrite every byte they keep.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::decode::Frame;

/// The most bytes of free buffers kept for reuse (the frames of about one in-flight scan request of
/// 340x256 video; larger frames are fewer of them).
pub const POOL_BYTES: usize = 128 << 20;

#[derive(Default)]
struct Pool {
    /// Free buffers by capacity.
    free: HashMap<usize, Vec<Vec<u8>>>,
    bytes: usize,
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(|| Mutex::new(Pool::default()))
}

/// A cleared buffer with room for `len` bytes: a reused one of exactly that capacity when free.
pub fn take(len: usize) -> Vec<u8> {
    let mut p = pool().lock();
    if let Some(buf) = p.free.get_mut(&len).and_then(Vec::pop) {
        p.bytes -= buf.capacity();
        drop(p);
        let mut buf = buf;
        buf.clear();
        return buf;
    }
    drop(p);
    Vec::with_capacity(len)
}

/// Keeps `buf` for a later [`take`] of its capacity, within [`POOL_BYTES`]; frees it otherwise.
pub fn give(buf: Vec<u8>) {
    let cap = buf.capacity();
    if cap == 0 {
        return;
    }
    let mut p = pool().lock();
    if p.bytes + cap > POOL_BYTES {
        return;
    }
    p.bytes += cap;
    p.free.entry(cap).or_default().push(buf);
}

/// Gives back the buffers of the frames in `frames` that nothing else holds (a frame listed twice is
/// given back once, at its last reference); returns how many.
pub fn recycle(frames: impl IntoIterator<Item = Arc<Frame>>) -> usize {
    let mut n = 0;
    for f in frames {
        if let Ok(frame) = Arc::try_unwrap(f) {
            give(frame.data);
            n += 1;
        }
    }
    n
}

/// Bytes of free buffers held now.
pub fn held_bytes() -> usize {
    pool().lock().bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unshared_frames_come_back_and_are_handed_out_again() {
        // A capacity no other test uses, so buffers of parallel tests do not interfere.
        let len = 3 * 7919;
        let frame = |v: u8| {
            let mut data = take(len);
            data.resize(len, v);
            Arc::new(Frame {
                width: 7919,
                height: 1,
                data,
            })
        };
        let (a, b) = (frame(1), frame(2));
        let held = a.clone(); // still referenced elsewhere (the cache): not recycled
        let ptr_b = b.data.as_ptr();
        assert_eq!(
            recycle([a, b.clone(), b]),
            1,
            "b once, at its last reference"
        );
        assert_eq!(held.data[0], 1);
        let again = take(len);
        assert_eq!(again.as_ptr(), ptr_b, "b's buffer is reused");
        assert!(again.is_empty() && again.capacity() >= len);
        give(again);
        assert!(held_bytes() >= len);
        // Beyond the bound, buffers are freed rather than kept.
        let before = held_bytes();
        give(Vec::with_capacity(POOL_BYTES + 1));
        assert_eq!(held_bytes(), before);
    }
}
