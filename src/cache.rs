//! The decoded-frame cache: frames after decode, resize and rotation, before per-request augmentation.
//!
//! Keyed by video identity (path, size, mtime, stream, and within a run the file's inode), frame index and geometry, so a changed file never
//! serves stale frames and different output sizes never collide. Weighted by bytes and bounded by
//! `--cache-bytes` (moka evicts by TinyLFU admission and LRU). Values are shared `Arc<Frame>`s: a hit
//! copies nothing until batch assembly.
//!
//! Admission ([`FrameCache::admits`]): a request's frames of one video enter the cache unless they are a
//! scan (more decoded bytes than `--cache-admit-fraction` of the capacity) or the client marked the
//! request one-pass ([`CachePolicy`]). Frames kept out are still served (and shared with concurrent
//! requests through single flight); they only never displace the working set of other jobs, and cost no
//! insertion. Lookups always happen, whatever the policy: a scan still takes the frames that are there.

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
    /// The file node (device, inode, change time) within this run: a file replaced by another of the
    /// same size and mtime is another video. Zero for identities that have no node (GulpIO videos, and
    /// the store's facts about a file, which outlive inodes: [`VideoId::plain`]).
    pub node: crate::dataset::FileNode,
    /// Indexed by decoding because the file turned out damaged: frame numbers and pixels may differ from
    /// the packet-scan table's, so frames of the two tables never share cache entries.
    pub decode_table: bool,
}

impl VideoId {
    /// An opaque hash of this version of the file (path, size, mtime and node; not the stream, nor how
    /// it was indexed), stable while the daemon runs: Probe's `version`, which GetClips'
    /// `expect_version` checks.
    pub fn version(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&self.path, self.size, self.mtime_ns, self.node).hash(&mut h);
        h.finish()
    }

    /// The identity the store's facts (health, damage) are kept by: path, size, mtime and stream, with
    /// no node and the packet-scan table.
    pub fn plain(&self) -> VideoId {
        VideoId {
            node: Default::default(),
            decode_table: false,
            ..self.clone()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FrameKey {
    pub video: Arc<VideoId>,
    pub frame: usize,
    pub geometry: Geometry,
}

/// Whether a request's decoded frames may enter the cache (the client's `cache_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CachePolicy {
    /// Enter unless the request's frames of one video are a scan (over the admission fraction).
    #[default]
    Auto,
    /// Never enter: the client reads these frames once (a full pass over a dataset, an evaluation).
    OnePass,
    /// Always enter, whatever their size (the behaviour before admission control).
    Keep,
}

/// `--cache-admit-fraction`'s default: a request's frames of one video that need more than 1/64 of
/// the cache (32 MiB of the default 2 GiB: 120 frames at 340x256, 5 at 1920x1080) are a scan.
pub const DEFAULT_ADMIT_FRACTION: f64 = crate::config::DEFAULT_ADMIT_PPM as f64 / 1e6;

#[derive(Clone)]
pub struct FrameCache {
    inner: moka::sync::Cache<FrameKey, Arc<Frame>>,
    /// The capacity in bytes, and the share of it above which one video's frames of a request are kept
    /// out (`Auto`).
    capacity: u64,
    admit_fraction: f64,
    counters: Arc<CacheCounters>,
}

/// What the cache did since start-up (for `/metrics` and GetStats).
#[derive(Default)]
struct CacheCounters {
    /// Entries removed to stay within the byte budget.
    evictions: AtomicU64,
    /// Frames inserted.
    admitted: AtomicU64,
    /// Decoded frames served without entering the cache (scans and one-pass requests).
    bypassed: AtomicU64,
}

impl FrameCache {
    /// A cache of `max_bytes` with the default admission fraction.
    pub fn new(max_bytes: u64) -> Self {
        Self::with_admission(max_bytes, DEFAULT_ADMIT_FRACTION)
    }

    /// A cache of `max_bytes` that keeps out a request's frames of one video beyond `admit_fraction`
    /// of it (`Auto` policy; 1.0 or more: only what exceeds the whole cache).
    pub fn with_admission(max_bytes: u64, admit_fraction: f64) -> Self {
        let counters = Arc::new(CacheCounters::default());
        let evicted = counters.clone();
        let inner = moka::sync::Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|_k: &FrameKey, v: &Arc<Frame>| {
                // Key and bookkeeping overhead counted roughly; frames are the bulk.
                u32::try_from(v.nbytes() + 128).unwrap_or(u32::MAX)
            })
            .eviction_listener(move |_k, _v, cause| {
                if cause == moka::notification::RemovalCause::Size {
                    evicted.evictions.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build();
        FrameCache {
            inner,
            capacity: max_bytes,
            admit_fraction,
            counters,
        }
    }

    /// Whether `bytes` of one video's decoded frames, asked for by one request under `policy`, enter
    /// the cache.
    pub fn admits(&self, policy: CachePolicy, bytes: u64) -> bool {
        match policy {
            CachePolicy::OnePass => false,
            CachePolicy::Keep => true,
            CachePolicy::Auto => bytes as f64 <= self.admit_fraction * self.capacity as f64,
        }
    }

    /// Entries evicted so far to stay within the byte budget.
    pub fn evictions(&self) -> u64 {
        self.counters.evictions.load(Ordering::Relaxed)
    }

    /// Frames inserted so far.
    pub fn admitted(&self) -> u64 {
        self.counters.admitted.load(Ordering::Relaxed)
    }

    /// Decoded frames served so far without entering the cache.
    pub fn bypassed(&self) -> u64 {
        self.counters.bypassed.load(Ordering::Relaxed)
    }

    pub fn get(&self, key: &FrameKey) -> Option<Arc<Frame>> {
        self.inner.get(key)
    }

    pub fn insert(&self, key: FrameKey, frame: Arc<Frame>) {
        self.counters.admitted.fetch_add(1, Ordering::Relaxed);
        self.inner.insert(key, frame);
    }

    /// Counts `frames` decoded frames that were served without entering the cache.
    pub fn bypass(&self, frames: u64) {
        self.counters.bypassed.fetch_add(frames, Ordering::Relaxed);
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
                node: Default::default(),
                decode_table: false,
            }),
            frame,
            geometry: Geometry {
                scaled_width: 10,
                scaled_height: 10,
                rotation: 0,
                mirror: false,
                resized: false,
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
    fn admission_follows_the_policy_and_the_fraction() {
        let cache = FrameCache::with_admission(1000, 0.25);
        assert!(cache.admits(CachePolicy::Auto, 250));
        assert!(!cache.admits(CachePolicy::Auto, 251));
        assert!(!cache.admits(CachePolicy::OnePass, 1));
        assert!(cache.admits(CachePolicy::Keep, 1 << 40));
        let f = Arc::new(Frame {
            width: 1,
            height: 1,
            data: vec![1, 2, 3],
        });
        cache.insert(key(1), f.clone());
        cache.insert(key(2), f);
        cache.bypass(5);
        assert_eq!((cache.admitted(), cache.bypassed()), (2, 5));
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
        let mut replaced = key(3);
        replaced.video = Arc::new(VideoId {
            node: crate::dataset::FileNode {
                dev: 1,
                ino: 2,
                ctime_ns: 3,
            },
            ..(*replaced.video).clone()
        });
        assert!(cache.get(&replaced).is_none());
    }
}
