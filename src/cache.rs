//! The decoded-frame cache: frames after decode, resize and rotation, before per-request augmentation.
//!
//! Keyed by video identity (path, size, mtime, stream), frame index and geometry, so a changed file never
//! serves stale frames and different output sizes never collide. Weighted by bytes and bounded by
//! `--cache-bytes` (moka evicts by TinyLFU admission and LRU). Values are shared `Arc<Frame>`s: a hit
//! copies nothing until batch assembly.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::decode::{Frame, Geometry};

/// Identifies one stream of one version of one file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VideoId {
    pub path: PathBuf,
    pub size: u64,
    pub mtime_ns: i128,
    /// Requested stream (None = best stream); part of the identity because it selects the frames.
    pub stream: Option<u32>,
    /// Indexed by decoding because the file turned out damaged: frame numbers and pixels may differ from
    /// the packet-scan table's, so frames of the two tables never share cache entries.
    pub decode_table: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FrameKey {
    pub video: Arc<VideoId>,
    pub frame: usize,
    pub geometry: Geometry,
}

#[derive(Clone)]
pub struct FrameCache {
    inner: moka::sync::Cache<FrameKey, Arc<Frame>>,
    /// Entries removed to stay within the byte budget (for `/metrics`).
    evictions: Arc<AtomicU64>,
}

impl FrameCache {
    pub fn new(max_bytes: u64) -> Self {
        let evictions = Arc::new(AtomicU64::new(0));
        let evicted = evictions.clone();
        let inner = moka::sync::Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|_k: &FrameKey, v: &Arc<Frame>| {
                // Key and bookkeeping overhead counted roughly; frames are the bulk.
                u32::try_from(v.nbytes() + 128).unwrap_or(u32::MAX)
            })
            .eviction_listener(move |_k, _v, cause| {
                if cause == moka::notification::RemovalCause::Size {
                    evicted.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build();
        FrameCache { inner, evictions }
    }

    /// Entries evicted so far to stay within the byte budget.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    pub fn get(&self, key: &FrameKey) -> Option<Arc<Frame>> {
        self.inner.get(key)
    }

    pub fn insert(&self, key: FrameKey, frame: Arc<Frame>) {
        self.inner.insert(key, frame);
    }

    /// Bytes held (approximate until moka's pending maintenance runs).
    pub fn weighted_bytes(&self) -> u64 {
        self.inner.weighted_size()
    }

    pub fn entries(&self) -> u64 {
        self.inner.entry_count()
    }

    /// Applies pending inserts and evictions (for exact counts in stats).
    pub fn sync(&self) {
        self.inner.run_pending_tasks();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(frame: usize) -> FrameKey {
        FrameKey {
            video: Arc::new(VideoId {
                path: "a.mp4".into(),
                size: 1,
                mtime_ns: 2,
                stream: None,
                decode_table: false,
            }),
            frame,
            geometry: Geometry {
                scaled_width: 10,
                scaled_height: 10,
                rotation: 0,
            },
        }
    }

    #[test]
    fn stays_within_its_byte_budget() {
        let cache = FrameCache::new(10 * 1000);
        for i in 0..100 {
            let f = Frame {
                width: 10,
                height: 10,
                data: vec![i as u8; 872],
            };
            cache.insert(key(i), Arc::new(f));
        }
        cache.sync();
        assert!(
            cache.weighted_bytes() <= 10 * 1000,
            "{}",
            cache.weighted_bytes()
        );
        assert!(cache.entries() >= 5);
        assert!(cache.evictions() > 0);
    }

    #[test]
    fn geometry_and_identity_are_part_of_the_key() {
        let cache = FrameCache::new(1 << 20);
        let f = Arc::new(Frame {
            width: 1,
            height: 1,
            data: vec![7, 7, 7],
        });
        cache.insert(key(3), f.clone());
        assert_eq!(cache.get(&key(3)).as_deref(), Some(&*f));
        let mut other = key(3);
        other.geometry.rotation = 90;
        assert!(cache.get(&other).is_none());
        let mut changed = key(3);
        changed.video = Arc::new(VideoId {
            mtime_ns: 3,
            ..(*changed.video).clone()
        });
        assert!(cache.get(&changed).is_none());
    }
}
