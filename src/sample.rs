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

/// Bytes one planned position costs at most (see [`MAX_SAMPLE_POSITIONS`]).
pub const POSITION_BYTES: u64 = 24;

/// The epoch's order of samples 0..n: a Fisher-Yates shuffle keyed by (seed, epoch), or 0..n.
pub fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
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
pub fn shard(order: &[usize], rank: usize, world: usize, remainder: Remainder) -> Vec<usize> {
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerKind {
    RandomIndices,
    RegularIndices,
    RandomTimestamps,
    RegularTimestamps,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShortVideo {
    RepeatLast,
    Wrap,
    Skip,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SamplerSpec {
    pub kind: SamplerKind,
    pub num_clips: u32,
    pub frames_per_clip: u32,
    pub frame_stride: u32,
    pub seconds_between_frames: Option<f64>,
    pub seconds_between_clip_starts: Option<f64>,
    pub range_start: Option<f64>,
    pub range_end: Option<f64>,
    pub short_video: ShortVideo,
}

impl SamplerSpec {
    /// Checks what needs no video.
    pub fn validate(&self) -> Result<(), SampleError> {
        let invalid = |m: String| Err(SampleError::Invalid(m));
        if self.frames_per_clip == 0 {
            return invalid("frames_per_clip must be at least 1".into());
        }
        if self.num_clips == 0 && self.kind != SamplerKind::RegularTimestamps {
            return invalid("num_clips must be at least 1".into());
        }
        if self.frame_stride == 0 {
            return invalid("frame_stride must be at least 1".into());
        }
        match self.kind {
            SamplerKind::RandomIndices | SamplerKind::RegularIndices => {
                for (name, v) in [
                    ("range_start", self.range_start),
                    ("range_end", self.range_end),
                ] {
                    if let Some(v) = v {
                        if !v.is_finite() || v.fract() != 0.0 {
                            return invalid(format!(
                                "{name} {v} must be a whole frame index for an index sampler"
                            ));
                        }
                    }
                }
            }
            SamplerKind::RandomTimestamps | SamplerKind::RegularTimestamps => {
                if let Some(s) = self.seconds_between_frames {
                    if !(s.is_finite() && s > 0.0) {
                        return invalid(format!("seconds_between_frames {s} must be > 0"));
                    }
                }
                for (name, v) in [
                    ("range_start", self.range_start),
                    ("range_end", self.range_end),
                ] {
                    if let Some(v) = v {
                        if !v.is_finite() {
                            return invalid(format!("{name} {v} must be finite"));
                        }
                    }
                }
            }
        }
        if self.kind == SamplerKind::RegularTimestamps {
            match self.seconds_between_clip_starts {
                Some(s) if s.is_finite() && s > 0.0 => {}
                Some(s) => return invalid(format!("seconds_between_clip_starts {s} must be > 0")),
                None => {
                    return invalid(
                        "the regular-timestamps sampler needs seconds_between_clip_starts".into(),
                    )
                }
            }
        }
        // Regular timestamps: at least one clip; how many more fit is checked per video (clip_count).
        let (n, f) = (self.num_clips.max(1) as u64, self.frames_per_clip as u64);
        if n * f > MAX_SAMPLE_POSITIONS {
            return invalid(format!(
                "num_clips {n} × frames_per_clip {f} = {} positions per sample exceed the limit of {MAX_SAMPLE_POSITIONS}",
                n * f
            ));
        }
        Ok(())
    }

    /// Clips per sample when it does not depend on the video.
    pub fn fixed_clip_count(&self) -> Option<u32> {
        match self.kind {
            SamplerKind::RegularTimestamps => None,
            _ => Some(self.num_clips),
        }
    }

    pub fn is_time_based(&self) -> bool {
        matches!(
            self.kind,
            SamplerKind::RandomTimestamps | SamplerKind::RegularTimestamps
        )
    }
}

/// What the samplers need to know about a video (after a manifest's trim).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VideoFacts {
    /// Frames in the view, and the index of its first frame in the video.
    pub frames: usize,
    pub first_frame: usize,
    pub avg_fps: f64,
    /// Seconds: the view's first frame's pts, and the end of its last frame.
    pub begin: f64,
    pub end: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ClipPositions {
    Frames(Vec<u64>),
    Times(Vec<f64>),
}

impl ClipPositions {
    pub fn len(&self) -> usize {
        match self {
            ClipPositions::Frames(v) => v.len(),
            ClipPositions::Times(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn apply_policy<T: Copy>(
    mut values: Vec<T>,
    want: usize,
    policy: ShortVideo,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>, SampleError> {
    if values.len() >= want {
        return Ok(values);
    }
    if values.is_empty() || policy == ShortVideo::Skip {
        return Err(SampleError::TooShort(what()));
    }
    match policy {
        ShortVideo::RepeatLast => {
            let last = values[values.len() - 1];
            values.resize(want, last);
            Ok(values)
        }
        ShortVideo::Wrap => Ok(values.iter().copied().cycle().take(want).collect()),
        ShortVideo::Skip => unreachable!("handled above"),
    }
}

/// `torch.linspace(start, end, steps, dtype=torch.int)`: computed in f64 from both ends (the first half
/// from `start`, the second from `end`) and truncated, as ATen's CPU kernel does.
pub fn torch_linspace_int(start: i64, end: i64, steps: usize) -> Vec<i64> {
    if steps == 0 {
        return Vec::new();
    }
    if steps == 1 {
        return vec![start];
    }
    let step = (end as f64 - start as f64) / (steps - 1) as f64;
    let halfway = steps / 2;
    (0..steps)
        .map(|i| {
            let v = if i < halfway {
                start as f64 + step * i as f64
            } else {
                end as f64 - step * (steps - i - 1) as f64
            };
            v as i64
        })
        .collect()
}

/// `torch.arange(start, end, step, dtype=torch.float64)` as TorchCodec uses it: `start + i * step` for
/// `ceil((end - start) / step)` values, then only those below `end` (arange may overshoot by rounding).
/// Its length is [`arange_count`]; callers bound that first.
pub fn torch_arange_f64(start: f64, end: f64, step: f64) -> Vec<f64> {
    (0..arange_count(start, end, step))
        .map(|i| start + step * i as f64)
        .collect()
}

/// How many values [`torch_arange_f64`] gives, without making them (saturating at `u64::MAX`).
pub fn arange_count(start: f64, end: f64, step: f64) -> u64 {
    let n = ((end - start) / step).ceil();
    if n.is_nan() || n <= 0.0 {
        return 0;
    }
    // `n as u64` saturates. The values are non-decreasing in i, so those below `end` are a prefix:
    // binary search for its length.
    let (mut lo, mut hi) = (0u64, n as u64);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if start + step * (mid as f64) < end {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

fn too_many(clips: u64, f: u64, step: f64) -> String {
    format!(
        "regular timestamps every {step} s give {clips} clips of {f} frames per sample, more than the limit of {MAX_SAMPLE_POSITIONS} positions"
    )
}

/// How many clips [`clips_for`] gives a video (when it gives any), computed without making them.
pub fn clip_count(spec: &SamplerSpec, facts: &VideoFacts) -> Result<u64, SampleError> {
    match spec.kind {
        SamplerKind::RegularTimestamps => {
            let (start, range_end, _) = time_range(spec, facts)?;
            let step = spec.seconds_between_clip_starts.unwrap_or(f64::INFINITY);
            Ok(arange_count(start, range_end, step))
        }
        _ => Ok(spec.num_clips as u64),
    }
}

/// The clips of one sample: `num_clips` (or, for regular timestamps, as many as fit) clips of
/// `frames_per_clip` positions each. `rng` is the sample's clip generator.
pub fn clips_for(
    spec: &SamplerSpec,
    facts: &VideoFacts,
    rng: &mut Rng,
) -> Result<Vec<ClipPositions>, SampleError> {
    if facts.frames == 0 {
        return Err(SampleError::TooShort("the video has no frames".into()));
    }
    if spec.is_time_based() {
        time_clips(spec, facts, rng)
    } else {
        index_clips(spec, facts, rng)
    }
}

fn index_clips(
    spec: &SamplerSpec,
    facts: &VideoFacts,
    rng: &mut Rng,
) -> Result<Vec<ClipPositions>, SampleError> {
    let n = facts.frames as i64;
    let f = spec.frames_per_clip as i64;
    let stride = spec.frame_stride as i64;
    let too_short = |m: String| SampleError::TooShort(m);
    let mut start = spec.range_start.map_or(0, |v| v as i64);
    if start < 0 {
        start += n;
    }
    if start < 0 || start >= n {
        return Err(too_short(format!(
            "range_start {} is outside the video's {n} frames",
            spec.range_start.unwrap_or(0.0)
        )));
    }
    let span = stride * (f - 1) + 1;
    let end = match spec.range_end {
        None => (n - span + 1).max(1),
        Some(e) => {
            let mut e = e as i64;
            if e < 0 {
                e += n;
            }
            e.min(n)
        }
    };
    if start >= end {
        return Err(too_short(format!(
            "no clip start in [{start}, {end}) for a video of {n} frames"
        )));
    }
    let starts: Vec<i64> = match spec.kind {
        SamplerKind::RandomIndices => (0..spec.num_clips)
            .map(|_| start + rng.below((end - start) as u64) as i64)
            .collect(),
        _ => torch_linspace_int(start, end - 1, spec.num_clips as usize),
    };
    starts
        .into_iter()
        .map(|s| {
            let upper = (s + span).min(n);
            let frames: Vec<i64> = (s..upper).step_by(stride as usize).collect();
            let frames = apply_policy(frames, f as usize, spec.short_video, || {
                format!("a clip of {f} frames every {stride} from frame {s} runs past the video's {n} frames")
            })?;
            Ok(ClipPositions::Frames(
                frames
                    .into_iter()
                    .map(|k| (k as usize + facts.first_frame) as u64)
                    .collect(),
            ))
        })
        .collect()
}

/// A timestamp sampler's window on a video: (first clip start, end of clip starts, seconds between a
/// clip's frames).
fn time_range(spec: &SamplerSpec, facts: &VideoFacts) -> Result<(f64, f64, f64), SampleError> {
    let too_short = |m: String| SampleError::TooShort(m);
    let f = spec.frames_per_clip as usize;
    let between = match spec.seconds_between_frames {
        Some(s) => s,
        None if facts.avg_fps > 0.0 && facts.avg_fps.is_finite() => 1.0 / facts.avg_fps,
        None => {
            return Err(too_short(
                "the video has no average frame rate; give seconds_between_frames".into(),
            ))
        }
    };
    let (begin, end) = (facts.begin, facts.end);
    let start = match spec.range_start {
        None => begin,
        Some(s) if s < begin || s >= end => {
            return Err(too_short(format!(
                "range_start {s} s is outside the video's [{begin}, {end}) s"
            )))
        }
        Some(s) => s,
    };
    let range_end = match spec.range_end {
        None => end - (f as f64 - 1.0) * between,
        Some(e) if e <= begin => {
            return Err(too_short(format!(
                "range_end {e} s is not after the video's start {begin} s"
            )))
        }
        Some(e) => e,
    };
    if start >= range_end {
        return Err(too_short(format!(
            "no clip start in [{start}, {range_end}) s for a video of [{begin}, {end}) s"
        )));
    }
    Ok((start, range_end.min(end), between))
}

fn time_clips(
    spec: &SamplerSpec,
    facts: &VideoFacts,
    rng: &mut Rng,
) -> Result<Vec<ClipPositions>, SampleError> {
    let f = spec.frames_per_clip as usize;
    let end = facts.end;
    let (start, range_end, between) = time_range(spec, facts)?;
    if spec.kind == SamplerKind::RegularTimestamps {
        let n = clip_count(spec, facts)?;
        if n.saturating_mul(f as u64) > MAX_SAMPLE_POSITIONS {
            let step = spec.seconds_between_clip_starts.unwrap_or(f64::INFINITY);
            return Err(SampleError::TooMany(format!(
                "{} (from {start} s to {range_end} s)",
                too_many(n, f as u64, step)
            )));
        }
    }
    let starts: Vec<f64> = match spec.kind {
        SamplerKind::RandomTimestamps => (0..spec.num_clips)
            .map(|_| rng.unit() * (range_end - start) + start)
            .collect(),
        _ => torch_arange_f64(
            start,
            range_end,
            spec.seconds_between_clip_starts.unwrap_or(f64::INFINITY),
        ),
    };
    starts
        .into_iter()
        .map(|s| {
            let times: Vec<f64> = (0..f)
                .map(|i| s + i as f64 * between)
                .filter(|&t| t < end)
                .collect();
            let times = apply_policy(times, f, spec.short_video, || {
                format!("a clip of {f} frames {between} s apart from {s} s runs past the video's end at {end} s")
            })?;
            Ok(ClipPositions::Times(times))
        })
        .collect()
}

/// A crop rectangle in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CropBox {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CropSpec {
    Random {
        width: u32,
        height: u32,
    },
    RandomResized {
        width: u32,
        height: u32,
        scale: (f64, f64),
        ratio: (f64, f64),
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct AugmentSpec {
    pub crop: Option<CropSpec>,
    pub random_hflip: bool,
}

/// One clip's augmentation: a crop box in the frame, an optional resize of the crop, a flip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClipAug {
    pub crop: Option<CropBox>,
    pub resize_to: Option<(u32, u32)>,
    pub flip: bool,
}

/// Draws a clip's augmentation for frames of `w`x`h`.
pub fn draw_augment(
    spec: &AugmentSpec,
    w: u32,
    h: u32,
    rng: &mut Rng,
) -> Result<ClipAug, SampleError> {
    let mut aug = ClipAug::default();
    match spec.crop {
        None => {}
        Some(CropSpec::Random { width, height }) => {
            if width > w || height > h {
                return Err(SampleError::Invalid(format!(
                    "random crop {width}x{height} does not fit in frames of {w}x{h}"
                )));
            }
            aug.crop = Some(CropBox {
                x: rng.below((w - width + 1) as u64) as u32,
                y: rng.below((h - height + 1) as u64) as u32,
                width,
                height,
            });
        }
        Some(CropSpec::RandomResized {
            width,
            height,
            scale,
            ratio,
        }) => {
            aug.crop = Some(random_resized_box(w, h, scale, ratio, rng));
            aug.resize_to = Some((width, height));
        }
    }
    // Drawn last and always, so adding a flip does not move the crops.
    let flip = rng.unit() < 0.5;
    aug.flip = spec.random_hflip && flip;
    Ok(aug)
}

/// torchvision's RandomResizedCrop.get_params: ten tries at an area in `scale` of the frame and a
/// log-uniform aspect ratio in `ratio`; then the largest centred box with a ratio inside `ratio`.
fn random_resized_box(
    w: u32,
    h: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut Rng,
) -> CropBox {
    let area = w as f64 * h as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * rng.uniform(scale.0, scale.1);
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let cw = (target * aspect).sqrt().round() as i64;
        let ch = (target / aspect).sqrt().round() as i64;
        if 0 < cw && cw <= w as i64 && 0 < ch && ch <= h as i64 {
            let (cw, ch) = (cw as u32, ch as u32);
            return CropBox {
                x: rng.below((w - cw + 1) as u64) as u32,
                y: rng.below((h - ch + 1) as u64) as u32,
                width: cw,
                height: ch,
            };
        }
    }
    let in_ratio = w as f64 / h as f64;
    let (cw, ch) = if in_ratio < ratio.0 {
        (w, ((w as f64 / ratio.0).round() as u32).clamp(1, h))
    } else if in_ratio > ratio.1 {
        (((h as f64 * ratio.1).round() as u32).clamp(1, w), h)
    } else {
        (w, h)
    };
    CropBox {
        x: (w - cw) / 2,
        y: (h - ch) / 2,
        width: cw,
        height: ch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: SamplerKind, num_clips: u32, f: u32, stride: u32) -> SamplerSpec {
        SamplerSpec {
            kind,
            num_clips,
            frames_per_clip: f,
            frame_stride: stride,
            seconds_between_frames: None,
            seconds_between_clip_starts: None,
            range_start: None,
            range_end: None,
            short_video: ShortVideo::RepeatLast,
        }
    }

    fn facts(frames: usize, fps: f64) -> VideoFacts {
        VideoFacts {
            frames,
            first_frame: 0,
            avg_fps: fps,
            begin: 0.0,
            end: frames as f64 / fps,
        }
    }

    fn frames(c: &ClipPositions) -> Vec<u64> {
        match c {
            ClipPositions::Frames(v) => v.clone(),
            ClipPositions::Times(_) => panic!("times"),
        }
    }

    #[test]
    fn rng_is_keyed_and_unbiased_enough() {
        let a: Vec<u64> = {
            let mut r = Rng::keyed(Purpose::Clips, &[1, 2, 3]);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::keyed(Purpose::Clips, &[1, 2, 3]);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::keyed(Purpose::Clips, &[1, 2, 4]);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut r = Rng::keyed(Purpose::Augment, &[0]);
        let mut counts = [0u32; 3];
        for _ in 0..30_000 {
            counts[r.below(3) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn shuffles_per_epoch_and_shards_cover_the_order() {
        let e0 = epoch_order(10, 7, 0, true);
        let e1 = epoch_order(10, 7, 1, true);
        assert_ne!(e0, e1);
        assert_eq!(e0, epoch_order(10, 7, 0, true));
        let mut sorted = e0.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_eq!(epoch_order(4, 7, 0, false), vec![0, 1, 2, 3]);

        let order: Vec<usize> = (0..10).map(|i| 100 + i).collect();
        assert_eq!(
            shard(&order, 0, 3, Remainder::Uneven),
            vec![100, 103, 106, 109]
        );
        assert_eq!(shard(&order, 2, 3, Remainder::Uneven), vec![102, 105, 108]);
        // Pad: 12 positions, the last two are the order's first two again.
        assert_eq!(
            shard(&order, 1, 3, Remainder::Pad),
            vec![101, 104, 107, 100]
        );
        assert_eq!(
            shard(&order, 2, 3, Remainder::Pad),
            vec![102, 105, 108, 101]
        );
        assert_eq!(shard(&order, 0, 3, Remainder::Drop), vec![100, 103, 106]);
        // Padding wraps more than once when there are fewer samples than ranks.
        assert_eq!(shard(&[5], 2, 3, Remainder::Pad), vec![5]);
        assert!(shard(&[5], 2, 3, Remainder::Drop).is_empty());
    }

    #[test]
    fn linspace_matches_torch() {
        // torchcodec's note: torch.linspace(0, 10, steps=20, dtype=torch.int).
        assert_eq!(
            torch_linspace_int(0, 10, 20),
            vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 10]
        );
        assert_eq!(torch_linspace_int(3, 9, 1), vec![3]);
        assert_eq!(torch_linspace_int(0, 249, 5), vec![0, 62, 124, 186, 249]);
    }

    #[test]
    fn regular_indices_like_torchcodec() {
        // 100 frames, 4 clips of 3 frames every 2: span 5, starts linspace(0, 95, 4) = 0, 31, 63, 95.
        let clips = clips_for(
            &spec(SamplerKind::RegularIndices, 4, 3, 2),
            &facts(100, 25.0),
            &mut Rng::keyed(Purpose::Clips, &[0]),
        )
        .unwrap();
        let got: Vec<Vec<u64>> = clips.iter().map(frames).collect();
        assert_eq!(
            got,
            vec![
                vec![0, 2, 4],
                vec![31, 33, 35],
                vec![63, 65, 67],
                vec![95, 97, 99]
            ]
        );
    }

    #[test]
    fn short_video_policies() {
        // 5 frames, clip of 4 every 2 (span 7): range end max(5 - 7 + 1, 1) = 1, frames 0, 2, 4.
        let mut s = spec(SamplerKind::RegularIndices, 1, 4, 2);
        let f = facts(5, 25.0);
        let mut rng = Rng::keyed(Purpose::Clips, &[0]);
        assert_eq!(
            frames(&clips_for(&s, &f, &mut rng).unwrap()[0]),
            vec![0, 2, 4, 4]
        );
        s.short_video = ShortVideo::Wrap;
        assert_eq!(
            frames(&clips_for(&s, &f, &mut rng).unwrap()[0]),
            vec![0, 2, 4, 0]
        );
        s.short_video = ShortVideo::Skip;
        assert!(matches!(
            clips_for(&s, &f, &mut rng),
            Err(SampleError::TooShort(_))
        ));
    }

    #[test]
    fn random_indices_stay_in_range_and_follow_the_key() {
        let s = spec(SamplerKind::RandomIndices, 50, 8, 4);
        let f = VideoFacts {
            first_frame: 10,
            ..facts(100, 25.0)
        };
        let draw = |key| clips_for(&s, &f, &mut Rng::keyed(Purpose::Clips, &[key])).unwrap();
        let a = draw(1);
        assert_eq!(a, draw(1));
        assert_ne!(a, draw(2));
        for c in &a {
            let v = frames(c);
            assert_eq!(v.len(), 8);
            // Starts in [0, 100 - 29 + 1), shifted by the view's first frame.
            assert!(v[0] >= 10 && v[0] < 10 + 72, "{v:?}");
            assert!(v.windows(2).all(|p| p[1] == p[0] + 4));
        }
    }

    #[test]
    fn regular_timestamps_in_float64_like_torchcodec() {
        let mut s = spec(SamplerKind::RegularTimestamps, 0, 3, 1);
        s.seconds_between_clip_starts = Some(1.0);
        let f = facts(100, 25.0); // 4 s
        let clips = clips_for(&s, &f, &mut Rng::keyed(Purpose::Clips, &[0])).unwrap();
        // Starts arange(0, 4 - 2/25, 1) = 0, 1, 2, 3.
        assert_eq!(clips.len(), 4);
        match &clips[1] {
            ClipPositions::Times(t) => {
                assert_eq!(t[0], 1.0);
                assert_eq!(t[1], 1.0 + 1.0 / 25.0);
            }
            _ => panic!(),
        }
    }

    #[test]
    fn random_crops_fit_and_flip_is_independent_of_crop() {
        let spec = AugmentSpec {
            crop: Some(CropSpec::Random {
                width: 224,
                height: 224,
            }),
            random_hflip: true,
        };
        let mut flips = 0;
        for k in 0..200 {
            let a = draw_augment(&spec, 340, 256, &mut Rng::keyed(Purpose::Augment, &[k])).unwrap();
            let c = a.crop.unwrap();
            assert!(c.x + c.width <= 340 && c.y + c.height <= 256);
            flips += a.flip as u32;
            let no_flip = AugmentSpec {
                random_hflip: false,
                ..spec
            };
            let b =
                draw_augment(&no_flip, 340, 256, &mut Rng::keyed(Purpose::Augment, &[k])).unwrap();
            assert_eq!(b.crop, a.crop);
            assert!(!b.flip);
        }
        assert!((60..140).contains(&flips), "{flips}");
        let rrc = AugmentSpec {
            crop: Some(CropSpec::RandomResized {
                width: 112,
                height: 112,
                scale: (0.08, 1.0),
                ratio: (0.75, 4.0 / 3.0),
            }),
            random_hflip: false,
        };
        for k in 0..200 {
            let a = draw_augment(&rrc, 340, 256, &mut Rng::keyed(Purpose::Augment, &[k])).unwrap();
            let c = a.crop.unwrap();
            assert!(c.x + c.width <= 340 && c.y + c.height <= 256 && c.width > 0);
            assert_eq!(a.resize_to, Some((112, 112)));
        }
        assert!(draw_augment(&spec, 100, 100, &mut Rng::keyed(Purpose::Augment, &[0])).is_err());
    }

    #[test]
    fn counts_are_computed_without_making_the_clips() {
        // The count is the length of the old filter over ceil((end - start) / step) values.
        for (a, b, step) in [
            (0.0f64, 4.0 - 2.0 / 25.0, 1.0),
            (0.1, 0.7, 0.1),
            (3.0, 3.0, 1.0),
            (0.0, 1.0, 0.3),
        ] {
            let n = ((b - a) / step).ceil().max(0.0) as usize;
            let old = (0..n)
                .map(|i| a + step * i as f64)
                .filter(|&t| t < b)
                .count() as u64;
            assert_eq!(arange_count(a, b, step), old, "arange({a}, {b}, {step})");
            assert_eq!(torch_arange_f64(a, b, step).len() as u64, old);
        }
        assert_eq!(
            arange_count(0.0, 1e9, 1e-12),
            u64::MAX,
            "saturates, never wraps"
        );
        let mut s = spec(SamplerKind::RegularTimestamps, 0, 2, 1);
        s.seconds_between_clip_starts = Some(1e-12);
        s.validate().unwrap();
        let f = facts(250, 25.0);
        let n = clip_count(&s, &f).unwrap();
        assert!(n > 9_000_000_000_000, "{n}");
        let t = std::time::Instant::now();
        assert!(matches!(
            clips_for(&s, &f, &mut Rng::keyed(Purpose::Clips, &[0])),
            Err(SampleError::TooMany(_))
        ));
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        s.seconds_between_clip_starts = Some(1.0);
        assert_eq!(clip_count(&s, &f).unwrap(), 10);
        assert_eq!(
            clip_count(&spec(SamplerKind::RandomIndices, 7, 3, 1), &f).unwrap(),
            7
        );
        // Fixed counts are bounded by the parameters alone.
        let huge = spec(SamplerKind::RandomIndices, 4_000_000_000, 1, 1);
        assert!(matches!(huge.validate(), Err(SampleError::Invalid(_))));
        assert!(spec(SamplerKind::RegularIndices, 1024, 1024, 1)
            .validate()
            .is_ok());
        assert!(spec(SamplerKind::RegularIndices, 1025, 1024, 1)
            .validate()
            .is_err());
    }
}
