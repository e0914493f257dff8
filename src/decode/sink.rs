//! Sinks: where a decoder writes a wanted frame when its bytes have a place waiting for them, instead of
//! a [`Frame`] of their own. A GetClips reply assembled in shared memory gives each wanted frame of a run
//! that bypasses the cache its offset in the reply, and the decode thread converts the frame there: the
//! converter's output goes once into the slot the client maps, with no frame buffer in between and no
//! copy at assembly.
//!
//! Input: memory that outlives every writer ([`SinkMemory`], held by the sink), the frame size, and per
//! wanted frame one offset. Output: at most one writable slot per frame ([`Sink::take`]). Invariants:
//! slots lie inside the memory and do not overlap (checked at [`Sink::new`]); a slot is handed out once,
//! so two writers never share it; whoever reads the memory reads it only after every run that holds the
//! sink has returned (the request awaits its runs before assembling). A run stuck past its deadline keeps
//! its sink, and so the memory, alive until it returns: the memory is never reused under a late writer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::Frame;

/// Memory a sink writes into: `bytes()` bytes at `base()`, valid and unmoved while the value lives.
pub trait SinkMemory: Send + Sync {
    fn base(&self) -> *mut u8;
    /// Bytes at `base()`.
    fn bytes(&self) -> usize;
}

/// One wanted frame's place.
struct Place {
    frame: usize,
    offset: usize,
    taken: AtomicBool,
}

/// Per wanted frame of one video, its place in `memory`.
pub struct Sink {
    memory: Arc<dyn SinkMemory>,
    frame_bytes: usize,
    /// By frame, ascending.
    places: Vec<Place>,
    /// Another request waits on a run writing here: the decoder also emits such frames as [`Frame`]s.
    shared: AtomicBool,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("frame_bytes", &self.frame_bytes)
            .field("frames", &self.places.len())
            .finish()
    }
}

impl Sink {
    /// A sink for frames of `frame_bytes` at `(frame, offset)` of `memory`; Err when a place lies outside
    /// the memory, overlaps another or a frame is listed twice.
    pub fn new(
        memory: Arc<dyn SinkMemory>,
        frame_bytes: usize,
        places: impl IntoIterator<Item = (usize, usize)>,
    ) -> Result<Sink, String> {
        let mut places: Vec<Place> = places
            .into_iter()
            .map(|(frame, offset)| Place {
                frame,
                offset,
                taken: AtomicBool::new(false),
            })
            .collect();
        places.sort_by_key(|p| p.frame);
        if places.windows(2).any(|w| w[0].frame == w[1].frame) {
            return Err("a frame has two places".into());
        }
        let mut spans: Vec<usize> = places.iter().map(|p| p.offset).collect();
        spans.sort_unstable();
        let len = memory.bytes();
        if spans.windows(2).any(|w| w[1] - w[0] < frame_bytes)
            || spans
                .last()
                .is_some_and(|&o| o.checked_add(frame_bytes).is_none_or(|end| end > len))
        {
            return Err(format!(
                "frame places of {frame_bytes} bytes overlap or leave the {len} bytes given"
            ));
        }
        Ok(Sink {
            memory,
            frame_bytes,
            places,
            shared: AtomicBool::new(false),
        })
    }

    pub fn frame_bytes(&self) -> usize {
        self.frame_bytes
    }

    /// Whether `frame` has a place here (taken or not).
    pub fn has(&self, frame: usize) -> bool {
        self.place(frame).is_some()
    }

    fn place(&self, frame: usize) -> Option<&Place> {
        self.places
            .binary_search_by_key(&frame, |p| p.frame)
            .ok()
            .map(|i| &self.places[i])
    }

    /// The place of `frame`, writable, if it has one nobody took yet.
    pub fn take(&self, frame: usize) -> Option<PlaceMut<'_>> {
        let p = self.place(frame)?;
        if p.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(PlaceMut {
            // SAFETY: the offset lies inside the memory (checked in `new`).
            ptr: unsafe { self.memory.base().add(p.offset) },
            len: self.frame_bytes,
            _sink: std::marker::PhantomData,
        })
    }

    /// Writes a converted frame into its place (for backends that convert into a [`Frame`] first); false
    /// when the frame has no free place or is not of the sink's size.
    pub fn put(&self, frame: usize, f: &Frame) -> bool {
        if f.data.len() != self.frame_bytes {
            return false;
        }
        match self.take(frame) {
            Some(mut slot) => {
                slot.copy_from_slice(&f.data);
                true
            }
            None => false,
        }
    }

    /// Marks the sink as read by other requests too (a request joined a run that writes here).
    pub fn mark_shared(&self) {
        self.shared.store(true, Ordering::Release);
    }

    pub fn shared(&self) -> bool {
        self.shared.load(Ordering::Acquire)
    }
}

/// One frame's place, taken: its bytes, writable while the sink lives.
pub struct PlaceMut<'a> {
    ptr: *mut u8,
    len: usize,
    _sink: std::marker::PhantomData<&'a Sink>,
}

impl std::ops::Deref for PlaceMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the place lies inside the memory and overlaps no other (checked in `Sink::new`), the
        // memory lives as long as the sink this borrows, and `take` hands each place out once, so this is
        // the only reference to these bytes until the reader, who reads only after every writer has
        // returned (module invariants).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for PlaceMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only live view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heap memory for a sink: a leaked box, given back by `into_inner`.
    struct HeapMemory {
        ptr: *mut u8,
        len: usize,
    }

    // SAFETY: written only through a sink's places (disjoint, handed out once), read after the writers.
    unsafe impl Send for HeapMemory {}
    unsafe impl Sync for HeapMemory {}

    impl HeapMemory {
        fn new(len: usize) -> HeapMemory {
            let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
            HeapMemory { ptr, len }
        }

        fn into_inner(self) -> Box<[u8]> {
            let me = std::mem::ManuallyDrop::new(self);
            // SAFETY: the box leaked in `new`, given back once.
            unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(me.ptr, me.len)) }
        }
    }

    impl SinkMemory for HeapMemory {
        fn base(&self) -> *mut u8 {
            self.ptr
        }
        fn bytes(&self) -> usize {
            self.len
        }
    }

    #[test]
    fn places_are_checked_and_handed_out_once() {
        let mem = Arc::new(HeapMemory::new(30));
        assert!(
            Sink::new(mem.clone(), 10, [(1, 0), (2, 5)]).is_err(),
            "overlap"
        );
        assert!(
            Sink::new(mem.clone(), 10, [(1, 0), (1, 10)]).is_err(),
            "twice"
        );
        assert!(Sink::new(mem.clone(), 10, [(1, 25)]).is_err(), "outside");
        let sink = Sink::new(mem.clone(), 10, [(7, 20), (3, 0)]).unwrap();
        assert!(sink.has(7) && sink.has(3) && !sink.has(4));
        sink.take(7).unwrap().fill(7);
        assert!(sink.take(7).is_none(), "a place is handed out once");
        assert!(sink.take(4).is_none());
        let f = Frame {
            width: 1,
            height: 1,
            data: vec![3; 10],
        };
        assert!(sink.put(3, &f));
        assert!(!sink.put(3, &f));
        drop(sink);
        let bytes = Arc::try_unwrap(mem).ok().unwrap().into_inner();
        assert_eq!(&bytes[..10], &[3; 10]);
        assert_eq!(&bytes[10..20], &[0; 10]);
        assert_eq!(&bytes[20..], &[7; 10]);
    }
}
