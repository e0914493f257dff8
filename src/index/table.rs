//! A frame table's storage: either vectors (a table just built by a scan, or made in a test) or the
//! columns of a store record read in place ([`Packed`]: the record's bytes on the heap, or a read-only
//! memory map of the record file), so that a cached table costs what its record costs on disk (a few
//! hundred bytes for a constant-frame-rate video) rather than 32 bytes per frame.
//!
//! Input: [`Frames`] and [`Keyframes`] from vectors (`From<Vec<_>>`), or from a [`Packed`] that the
//! store's format module validated once ([`Packed::new`]: every column value computable without
//! overflow, keyframes ascending and below the frame count). Output: frame k as a [`FrameEntry`] value,
//! keyframe i as a position, in O(1) either way.
//!
//! Invariants: a `Packed`'s byte ranges lie inside its bytes and its values were checked at
//! construction, so reads never fail or panic for k below the length; lengths only shrink
//! ([`Frames::truncate`], [`Keyframes::keep_below`]: a sampler's view of a damaged video).

use std::sync::Arc;

use super::FrameEntry;

/// The bytes a packed table reads from.
pub enum TableBytes {
    Heap(Box<[u8]>),
    /// A read-only map of a store record file. The store replaces record files by rename and deletes
    /// them whole, so the mapped inode is never written or truncated by vserve while it is mapped.
    Mapped(memmap2::Mmap),
}

impl TableBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            TableBytes::Heap(b) => b,
            TableBytes::Mapped(m) => m,
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self, TableBytes::Mapped(_))
    }
}

/// How one i64 column is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnKind {
    /// Value k = base + k * step.
    Linear,
    /// Value k = base + i32 at offset + 4k.
    Offsets,
    /// Value k = i64 at offset + 8k.
    Wide,
}

/// One column's descriptor (as the record's header gives it).
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub kind: ColumnKind,
    pub base: i64,
    pub step: i64,
    pub offset: usize,
}

/// A table's columns inside a record's bytes: pts, duration, stated duration, key bits, keyframes.
pub struct Packed {
    bytes: TableBytes,
    columns: [Column; 3],
    bits_at: usize,
    keyframes_at: usize,
    n: usize,
    m: usize,
}

/// Why bytes do not hold the columns they are said to.
#[derive(Debug, PartialEq, Eq)]
pub struct BadColumns(pub &'static str);

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le_i32(b: &[u8], at: usize) -> i32 {
    le_u32(b, at) as i32
}

fn le_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_le_bytes(a)
}

fn inside(len: usize, at: usize, count: usize, width: usize) -> Result<(), BadColumns> {
    count
        .checked_mul(width)
        .and_then(|w| at.checked_add(w))
        .filter(|&end| end <= len)
        .map(|_| ())
        .ok_or(BadColumns("section past the end"))
}

impl Packed {
    /// Checks every column of `n` frames and the `m` keyframes against `bytes` once, so that reads need
    /// no checks: sections inside the bytes, every value computable without overflow, keyframes
    /// strictly ascending and below `n`.
    pub fn new(
        bytes: TableBytes,
        columns: [Column; 3],
        bits_at: usize,
        keyframes_at: usize,
        n: usize,
        m: usize,
    ) -> Result<Packed, BadColumns> {
        let b = bytes.as_slice();
        inside(b.len(), bits_at, n.div_ceil(8), 1)?;
        for c in &columns {
            match c.kind {
                ColumnKind::Linear => {
                    // Linear in k: the ends bound every value.
                    let last = (n.saturating_sub(1) as i64)
                        .checked_mul(c.step)
                        .and_then(|x| x.checked_add(c.base));
                    if n > 0 && last.is_none() {
                        return Err(BadColumns("linear column overflows"));
                    }
                }
                ColumnKind::Offsets => {
                    inside(b.len(), c.offset, n, 4)?;
                    if (0..n).any(|k| {
                        c.base
                            .checked_add(le_i32(b, c.offset + 4 * k) as i64)
                            .is_none()
                    }) {
                        return Err(BadColumns("offset column overflows"));
                    }
                }
                ColumnKind::Wide => inside(b.len(), c.offset, n, 8)?,
            }
        }
        inside(b.len(), keyframes_at, m, 4)?;
        let mut prev: Option<u32> = None;
        for i in 0..m {
            let k = le_u32(b, keyframes_at + 4 * i);
            if prev.is_some_and(|p| p >= k) || k as usize >= n {
                return Err(BadColumns("keyframes"));
            }
            prev = Some(k);
        }
        Ok(Packed {
            bytes,
            columns,
            bits_at,
            keyframes_at,
            n,
            m,
        })
    }

    fn value(&self, c: usize, k: usize) -> i64 {
        let c = self.columns[c];
        let b = self.bytes.as_slice();
        // Checked at construction: none of these overflows.
        match c.kind {
            ColumnKind::Linear => c.base.wrapping_add((k as i64).wrapping_mul(c.step)),
            ColumnKind::Offsets => c.base.wrapping_add(le_i32(b, c.offset + 4 * k) as i64),
            ColumnKind::Wide => le_i64(b, c.offset + 8 * k),
        }
    }

    fn frame(&self, k: usize) -> FrameEntry {
        let b = self.bytes.as_slice();
        FrameEntry {
            pts: self.value(0, k),
            duration: self.value(1, k),
            key: b[self.bits_at + k / 8] & (1 << (k % 8)) != 0,
            stated_duration: self.value(2, k),
        }
    }

    fn keyframe(&self, i: usize) -> usize {
        le_u32(self.bytes.as_slice(), self.keyframes_at + 4 * i) as usize
    }

    pub fn frames(self: &Arc<Self>) -> Frames {
        Cells(Repr::Packed(self.clone(), self.n))
    }

    pub fn keyframes(self: &Arc<Self>) -> Keyframes {
        Cells(Repr::Packed(self.clone(), self.m))
    }

    /// Bytes held on the heap (0 for a mapped record) and whether the record is mapped.
    pub fn footprint(&self) -> (usize, bool) {
        match &self.bytes {
            TableBytes::Heap(b) => (b.len(), false),
            TableBytes::Mapped(_) => (0, true),
        }
    }
}

/// A column read as an owned vector (a fresh scan, tests) or in place from a packed table.
pub trait Cell: Copy + std::fmt::Debug + PartialEq {
    /// Cell `i` of the packed table's column of this kind.
    fn read(p: &Packed, i: usize) -> Self;
}

impl Cell for FrameEntry {
    fn read(p: &Packed, i: usize) -> FrameEntry {
        p.frame(i)
    }
}

impl Cell for usize {
    fn read(p: &Packed, i: usize) -> usize {
        p.keyframe(i)
    }
}

#[derive(Clone)]
enum Repr<T> {
    Owned(Vec<T>),
    /// The first `usize` cells of the packed table's column.
    Packed(Arc<Packed>, usize),
}

/// One column of a frame table: owned, or a view of a packed record ([`Frames`], [`Keyframes`]).
#[derive(Clone)]
pub struct Cells<T>(Repr<T>);

/// Frames in presentation order.
pub type Frames = Cells<FrameEntry>;

/// Keyframe positions, ascending.
pub type Keyframes = Cells<usize>;

impl<T> From<Vec<T>> for Cells<T> {
    fn from(v: Vec<T>) -> Cells<T> {
        Cells(Repr::Owned(v))
    }
}

impl<T> FromIterator<T> for Cells<T> {
    fn from_iter<I: IntoIterator<Item = T>>(it: I) -> Cells<T> {
        Cells(Repr::Owned(it.into_iter().collect()))
    }
}

impl<T: Cell> Cells<T> {
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Owned(v) => v.len(),
            Repr::Packed(_, n) => *n,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cell k, if the column has it.
    pub fn get(&self, k: usize) -> Option<T> {
        (k < self.len()).then(|| self.at(k))
    }

    /// Cell k. Panics past the end, as indexing a slice does.
    pub fn at(&self, k: usize) -> T {
        match &self.0 {
            Repr::Owned(v) => v[k],
            Repr::Packed(p, n) => {
                assert!(k < *n, "cell {k} of a column of {n}");
                T::read(p, k)
            }
        }
    }

    pub fn first(&self) -> Option<T> {
        self.get(0)
    }

    pub fn last(&self) -> Option<T> {
        self.len().checked_sub(1).map(|k| self.at(k))
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = T> + '_ {
        (0..self.len()).map(|k| self.at(k))
    }

    /// The first k for which `pred` is false, for a `pred` true on a prefix (as `slice::partition_point`).
    pub fn partition_point(&self, mut pred: impl FnMut(&T) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(&self.at(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Keeps the first `n` cells.
    pub fn truncate(&mut self, n: usize) {
        match &mut self.0 {
            Repr::Owned(v) => v.truncate(n),
            Repr::Packed(_, len) => *len = (*len).min(n),
        }
    }

    pub fn to_vec(&self) -> Vec<T> {
        self.iter().collect()
    }

    /// The cells as an owned vector to edit (a packed view is copied out first).
    pub fn make_mut(&mut self) -> &mut Vec<T> {
        if let Repr::Packed(..) = self.0 {
            self.0 = Repr::Owned(self.iter().collect());
        }
        match &mut self.0 {
            Repr::Owned(v) => v,
            Repr::Packed(..) => unreachable!("made owned above"),
        }
    }

    pub fn is_packed(&self) -> bool {
        matches!(self.0, Repr::Packed(..))
    }

    /// Heap bytes this column holds (a packed view: its whole record's bytes, keyframes included, 0 when
    /// mapped; count one column of a table).
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::Owned(v) => v.len() * std::mem::size_of::<T>(),
            Repr::Packed(p, _) => p.footprint().0,
        }
    }

    /// Whether the column reads a memory-mapped record.
    pub fn is_mapped(&self) -> bool {
        matches!(&self.0, Repr::Packed(p, _) if p.footprint().1)
    }
}

impl Keyframes {
    /// Keyframes at or before `k`.
    pub fn count_at_or_before(&self, k: usize) -> usize {
        self.partition_point(|&at| at <= k)
    }

    /// Keeps the keyframes before frame `n`.
    pub fn keep_below(&mut self, n: usize) {
        let keep = if n == 0 {
            0
        } else {
            self.count_at_or_before(n - 1)
        };
        self.truncate(keep);
    }
}

impl<T: Cell> PartialEq for Cells<T> {
    fn eq(&self, other: &Cells<T>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: Cell> std::fmt::Debug for Cells<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(kinds: [ColumnKind; 3], n: usize, keys: &[u32]) -> Result<Packed, BadColumns> {
        // Layout: offsets column at 0 (4n), wide column after (8n), bits, keyframes.
        let mut b = Vec::new();
        for k in 0..n {
            b.extend_from_slice(&(k as i32 * 7).to_le_bytes());
        }
        let wide_at = b.len();
        for k in 0..n {
            b.extend_from_slice(&(k as i64 * 1000).to_le_bytes());
        }
        let bits_at = b.len();
        let mut bits = vec![0u8; n.div_ceil(8)];
        for &k in keys {
            bits[k as usize / 8] |= 1 << (k % 8);
        }
        b.extend_from_slice(&bits);
        let kf_at = b.len();
        for &k in keys {
            b.extend_from_slice(&k.to_le_bytes());
        }
        let col = |kind| Column {
            kind,
            base: 5,
            step: 3,
            offset: if kind == ColumnKind::Wide { wide_at } else { 0 },
        };
        Packed::new(
            TableBytes::Heap(b.into_boxed_slice()),
            kinds.map(col),
            bits_at,
            kf_at,
            n,
            keys.len(),
        )
    }

    #[test]
    fn packed_columns_read_in_place() {
        let p = Arc::new(
            packed(
                [ColumnKind::Linear, ColumnKind::Offsets, ColumnKind::Wide],
                20,
                &[0, 9, 17],
            )
            .unwrap(),
        );
        let f = p.frames();
        assert_eq!(f.len(), 20);
        assert_eq!(
            f.at(4),
            FrameEntry {
                pts: 5 + 12,
                duration: 5 + 28,
                key: false,
                stated_duration: 4000
            }
        );
        assert!(f.at(9).key && f.at(17).key && !f.at(16).key);
        assert_eq!(f.partition_point(|e| e.pts <= 5 + 3 * 10), 11);
        let owned: Frames = f.iter().collect::<Vec<_>>().into();
        assert_eq!(owned, f);
        let mut k = p.keyframes();
        assert_eq!(k.to_vec(), vec![0, 9, 17]);
        assert_eq!(k.count_at_or_before(9), 2);
        k.keep_below(9);
        assert_eq!(k.to_vec(), vec![0]);
        let mut t = f.clone();
        t.truncate(3);
        assert_eq!(t.len(), 3);
        assert_eq!(t.last(), f.get(2));
        assert_eq!(t.get(3), None);
        t.make_mut()[0].pts = -1;
        assert_eq!(t.at(0).pts, -1);
        assert_eq!(f.at(0).pts, 5, "editing a copy leaves the packed table");
    }

    #[test]
    fn bad_columns_are_refused_at_construction() {
        assert!(packed([ColumnKind::Linear; 3], 4, &[0, 2]).is_ok());
        assert_eq!(
            packed([ColumnKind::Linear; 3], 4, &[2, 0]).err(),
            Some(BadColumns("keyframes"))
        );
        assert_eq!(
            packed([ColumnKind::Linear; 3], 4, &[0, 4]).err(),
            Some(BadColumns("keyframes"))
        );
        let over = Packed::new(
            TableBytes::Heap(vec![0u8; 8].into_boxed_slice()),
            [Column {
                kind: ColumnKind::Linear,
                base: i64::MAX - 1,
                step: 1,
                offset: 0,
            }; 3],
            0,
            0,
            3,
            0,
        );
        assert_eq!(over.err(), Some(BadColumns("linear column overflows")));
        let short = Packed::new(
            TableBytes::Heap(vec![0u8; 8].into_boxed_slice()),
            [Column {
                kind: ColumnKind::Wide,
                base: 0,
                step: 0,
                offset: 0,
            }; 3],
            0,
            0,
            3,
            0,
        );
        assert_eq!(short.err(), Some(BadColumns("section past the end")));
    }
}
