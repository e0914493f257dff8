//! Sampling: what a stream reads. Pure functions, no I/O, unit-tested without FFmpeg.
//!
//! Inputs: the dataset's sample count, (seed, epoch, rank, world size), the sampler's parameters and, per
//! video, the facts its index gives ([`VideoFacts`]). Outputs: the epoch's sample order, one rank's shard,
//! each sample's clip positions ([`ClipPositions`]) and each clip's augmentation ([`ClipAug`]).
//!
//! Invariants:
//! - The epoch's order is a function of (sample count, seed, epoch) only; a rank's shard adds (rank,
//!   world size, remainder policy). Ranks' shards are disjoint and cover the dataset under
//!   [`Remainder::Uneven`].
//! - A clip's positions and augmentation are a function of (seed, epoch, sample, clip) and the video's
//!   facts, never of the rank, the batch or what was read before, so a resumed stream is exactly the
//!   tail of an uninterrupted one.
//! - The index samplers reproduce TorchCodec's `clips_at_{random,regular}_indices` (regular: same
//!   indices; random: same distribution from our own generator); the timestamp samplers reproduce
//!   `clips_at_{random,regular}_timestamps` (TorchCodec 0.17: float64 arithmetic throughout; a time
//!   picks the last frame whose pts <= t, compared exactly).
//!
//! - Sizes are bounded before anything is materialised: a sample plans at most
//!   [`MAX_SAMPLE_POSITIONS`] positions (clips × frames per clip), checked from the parameters alone
//!   ([`SamplerSpec::validate`]) or, for regular timestamps, from [`clip_count`] before any clip exists.
//!
//! Randomness comes from [`Rng`], SplitMix64 keyed by the tuple it serves, so the streams are stable
//! across releases and platforms (no dependency on a crate's generator).

/// SplitMix64 (Steele, Lea, Flood 2014), seeded by hashing a key tuple.
#[derive(Clone, Debug)]
pub struct Rng(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a generator is for: part of its key, so draws for different purposes never correlate.
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub enum Purpose {
    Shuffle = 1,
    Clips = 2,
    Augment = 3,
}

impl Rng {
    pub fn keyed(purpose: Purpose, key: &[u64]) -> Rng {
        let mut h = mix64(GOLDEN ^ purpose as u64);
        for &k in key {
            h = mix64(h.wrapping_add(GOLDEN) ^ k);
        }
        Rng(h)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix64(self.0)
    }

    /// Uniform in [0, n) without modulo bias (Lemire's method); 0 when n is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        loop {
            let m = (self.next_u64() as u128) * (n as u128);
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SampleError {
    /// The video cannot hold the clip the sampler asks for (a per-video condition: the sample is skipped
    /// and replaced, reported as TOO_SHORT).
    #[error("{0}")]
    TooShort(String),
    /// The request's parameters are invalid whatever the video.
    #[error("{0}")]
    Invalid(String),
    /// The parameters give this video more clip positions than a sample may plan
    /// ([`MAX_SAMPLE_POSITIONS`]): the request's fault, not the video's.
    #[error("{0}")]
    TooMany(String),
}

/// Most clip positions (clips × frames per clip) one sample may plan: a sample's clip list is built
/// whole (about 24 bytes a position: its time or frame, the frame number, a copy per batch).
pub const MAX_SAMPLE_POSITIONS: u64 = 1 << 20;

/// Bytes one planned position is charged to the in-flight budget (see [`MAX_SAMPLE_POSITIONS`]): its
/// 24 bytes, doubled for the allocations of short clips (a 2-frame clip is a vector of its own). Twelve
/// streams of 1M-position plans peaked at 540 MB resident above idle, with 115 MiB charged at 24.
pub const POSITION_BYTES: u64 = 48;

/// The epoch's order of samples 0..n: a Fisher-Yates shuffle keyed by (seed, epoch), or 0..n. Sample
/// numbers are u32 (4 bytes a sample held by every open stream; a manifest holds at most about ten
/// million rows).
pub fn epoch_order(n: u32, seed: u64, epoch: u64, shuffle: bool) -> Vec<u32> {
    let n = n as usize;
    let mut order: Vec<u32> = (0..n as u32).collect();
    if shuffle {
        let mut rng = Rng::keyed(Purpose::Shuffle, &[seed, epoch]);
        for i in (1..n).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
    }
    order
}

/// How ranks split an epoch whose length is not a multiple of the world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remainder {
    /// Rank r takes positions r, r + W, r + 2W, ... of the order: shards differ by at most one sample,
    /// are disjoint, and together are the whole dataset.
    Uneven,
    /// As DistributedSampler(drop_last=False): the order is extended by its own first samples (cyclically)
    /// to a multiple of W, then split as above; every rank gets ceil(N / W).
    Pad,
    /// As DistributedSampler(drop_last=True): the order's last N mod W samples are left out; every rank
    /// gets floor(N / W).
    Drop,
}

/// Rank `rank`'s samples, in the order it reads them.
pub fn shard(order: &[u32], rank: usize, world: usize, remainder: Remainder) -> Vec<u32> {
    let n = order.len();
    let world = world.max(1);
    let total = match remainder {
        Remainder::Uneven => n,
        Remainder::Pad => n.div_ceil(world) * world,
        Remainder::Drop => n / world * world,
    };
    if n == 0 {
        return Vec::new();
    }
    (rank..total).step_by(world).map(|i| order[i % n]).collect()
}

mod augment;
mod clips;

pub use augment::{draw_augment, AugmentSpec, ClipAug, CropBox, CropSpec};
pub use clips::{
    arange_count, clip_count, clips_for, torch_arange_f64, torch_linspace_int, ClipPositions,
    SamplerKind, SamplerSpec, ShortVideo, VideoFacts,
};

#[cfg(test)]
mod tests;
