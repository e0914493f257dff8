//! Clip positions: the sampler's parameters ([`SamplerSpec`]) and a video's facts ([`VideoFacts`]) give
//! each sample's clips ([`ClipPositions`]), frame indices for the index samplers and seconds for the
//! timestamp samplers, as TorchCodec's `clips_at_*` functions compute them (see the parent module).

use super::{Rng, SampleError, MAX_SAMPLE_POSITIONS};

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
                                "{name} {} must be a whole frame index for an index sampler",
                                Num(v)
                            ));
                        }
                    }
                }
                // Both counted from the same end (negative: from the last frame): comparable here.
                if let (Some(a), Some(b)) = (self.range_start, self.range_end) {
                    if (a < 0.0) == (b < 0.0) && a >= b {
                        return invalid(format!(
                            "range_start {} must be before range_end {} (an empty range)",
                            Num(a),
                            Num(b)
                        ));
                    }
                }
            }
            SamplerKind::RandomTimestamps | SamplerKind::RegularTimestamps => {
                if let Some(s) = self.seconds_between_frames {
                    if !(s.is_finite() && s > 0.0) {
                        return invalid(format!("seconds_between_frames {} must be > 0", Num(s)));
                    }
                }
                for (name, v) in [
                    ("range_start", self.range_start),
                    ("range_end", self.range_end),
                ] {
                    if let Some(v) = v {
                        if !v.is_finite() {
                            return invalid(format!("{name} {} must be finite", Num(v)));
                        }
                    }
                }
                if let (Some(a), Some(b)) = (self.range_start, self.range_end) {
                    if a >= b {
                        return invalid(format!(
                            "range_start {} s must be before range_end {} s (an empty range)",
                            Num(a),
                            Num(b)
                        ));
                    }
                }
            }
        }
        if self.kind == SamplerKind::RegularTimestamps {
            match self.seconds_between_clip_starts {
                Some(s) if s.is_finite() && s > 0.0 => {}
                Some(s) => return invalid(format!("seconds_between_clip_starts {} must be > 0", Num(s))),
                None => {
                    return invalid(
                        "the regular-timestamps sampler needs seconds_between_clip_starts > 0 (it is 0 or unset)"
                            .into(),
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
        "regular timestamps every {step:?} s give {clips} clips of {f} frames per sample, more than the limit of {MAX_SAMPLE_POSITIONS} positions"
    )
}

/// A client's number in a message: as written for everyday values, in exponent form beyond (1e308 was
/// shown as 309 digits).
struct Num(f64);

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.0.abs();
        if a != 0.0 && a.is_finite() && !(1e-6..1e15).contains(&a) {
            write!(f, "{:e}", self.0)
        } else {
            write!(f, "{}", self.0)
        }
    }
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
        // A range end far before the start saturates: shown as 0, with the value asked.
        let asked = spec
            .range_end
            .map(|e| format!(" (range_end {e:?})"))
            .unwrap_or_default();
        return Err(too_short(format!(
            "no clip start in [{start}, {}) for a video of {n} frames{asked}",
            end.max(0)
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
                "range_start {} s is outside the video's [{begin}, {end}) s",
                Num(s)
            )))
        }
        Some(s) => s,
    };
    let range_end = match spec.range_end {
        None => end - (f as f64 - 1.0) * between,
        Some(e) if e <= begin => {
            return Err(too_short(format!(
                "range_end {} s is not after the video's start {begin} s",
                Num(e)
            )))
        }
        Some(e) => e,
    };
    if start >= range_end {
        return Err(too_short(format!(
            "no clip start in [{}, {}) s for a video of [{begin}, {end}) s",
            Num(start),
            Num(range_end)
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
                "{} (from {} s to {} s)",
                too_many(n, f as u64, step),
                Num(start),
                Num(range_end)
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
                format!("a clip of {f} frames {} s apart from {} s runs past the video's end at {end} s", Num(between), Num(s))
            })?;
            Ok(ClipPositions::Times(times))
        })
        .collect()
}
