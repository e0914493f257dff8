//! Requests in domain types (no protobuf): which clips, where in each video, and how to transform them;
//! the checks that need no file ([`ClipsRequest::validate`], [`Transform::validate`]), and what needs a
//! video's index: positions to frame numbers ([`resolve_positions`]) and the decoder's output geometry
//! ([`Transform::geometry`]); and the byte counts requests are admitted on ([`frame_bytes`],
//! [`array_bytes`], [`check_output_bytes`]), computed without overflow.

use crate::batch::{self, BatchSpec, DType};
use crate::budget::Reservation;
use crate::config::Limits;
use crate::decode::Geometry;
use crate::error::Error;
use crate::index::{Lookup, VideoIndex};

/// Where in a video a clip's frames are.
#[derive(Clone, Debug, PartialEq)]
pub enum Positions {
    Frames(Vec<u64>),
    Times(Vec<f64>),
}

impl Positions {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        match self {
            Positions::Frames(v) => v.len(),
            Positions::Times(v) => v.len(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClipRequest {
    pub video: String,
    pub stream: Option<u32>,
    pub positions: Positions,
    /// The file's version the client read its table from (Probe's `version`): refused when it changed.
    pub expect_version: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resize {
    Native,
    Exact { width: u32, height: u32 },
    ShortSide(u32),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Transform {
    pub resize: Resize,
    pub rotate: bool,
    pub batch: BatchSpec,
}

impl Default for Transform {
    fn default() -> Self {
        Transform {
            resize: Resize::Native,
            rotate: true,
            batch: BatchSpec::default(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClipsRequest {
    pub dataset: String,
    pub clips: Vec<ClipRequest>,
    pub transform: Transform,
    /// Assemble the reply straight into a one-shot shared-memory arena (`ClipsReply::shm`) rather than
    /// into `ClipsReply::data`.
    pub shm: bool,
    /// With `shm`: the client lets the arena be reused after releasing it (`reuse_arena`).
    pub shm_reuse: bool,
    /// Whether the decoded frames may enter the cache.
    pub cache_policy: crate::cache::CachePolicy,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestStats {
    pub frames_decoded: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub gop_runs: u64,
    pub shared_frames: u64,
    pub frames_skipped: u64,
}

impl RequestStats {
    pub fn add(&mut self, o: &RequestStats) {
        self.frames_decoded += o.frames_decoded;
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.gop_runs += o.gop_runs;
        self.shared_frames += o.shared_frames;
        self.frames_skipped += o.frames_skipped;
    }
}

#[derive(Clone, Debug)]
pub struct ClipMeta {
    pub video: String,
    pub frames: Vec<u64>,
    pub pts: Vec<i64>,
    pub pts_seconds: Vec<f64>,
    /// Per frame: the duration the stream states for it (FFmpeg's frame duration), in seconds.
    pub duration_seconds: Vec<f64>,
}

#[derive(Debug)]
pub struct ClipsReply {
    pub shape: Vec<u64>,
    /// The array's bytes; empty when they are in `shm`.
    pub data: Vec<u8>,
    /// Where the array is when the request asked for shared memory.
    pub shm: Option<crate::transport::shm::ShmRef>,
    /// Bytes of the array, wherever it is.
    pub nbytes: u64,
    pub clips: Vec<ClipMeta>,
    pub stats: RequestStats,
    /// The reply's bytes against the in-flight budget, held until the reply has been handed to the
    /// transport.
    pub reservation: Option<Reservation>,
}

#[derive(Clone, Debug)]
pub struct DatasetSummary {
    pub name: String,
    pub root: String,
    pub video_count: u64,
    /// The samples a stream draws from (manifest rows, else the videos a scan lists).
    pub samples: u64,
    /// Each distinct label and its label index.
    pub classes: Vec<(String, i64)>,
    /// The root's walk is under way (until the first one completes, the counts are of the videos
    /// found so far).
    pub building: bool,
    /// The current sample list's fingerprint (`Samples::fingerprint`; 0 while the first walk runs).
    pub samples_fingerprint: u64,
}

impl ClipsRequest {
    /// Checks everything that needs no file before any work or allocation.
    pub fn validate(&self, limits: &Limits) -> Result<(), Error> {
        let req = self;
        if req.clips.is_empty() {
            return Err(Error::InvalidArgument("request has no clips".into()));
        }
        if req.clips.len() > limits.max_clips {
            return Err(Error::InvalidArgument(format!(
                "{} clips exceed the limit of {} per request",
                req.clips.len(),
                limits.max_clips
            )));
        }
        let t = req.clips[0].positions.len();
        let mut total: usize = 0;
        for c in &req.clips {
            let n = c.positions.len();
            if n == 0 {
                return Err(Error::InvalidArgument(format!(
                    "clip of {:?} has no frames or times",
                    c.video
                )));
            }
            if let Positions::Times(times) = &c.positions {
                if times.iter().any(|x| x.is_nan()) {
                    return Err(Error::InvalidArgument(format!(
                        "clip of {:?} asks for a time that is not a number (NaN)",
                        c.video
                    )));
                }
            }
            if n != t {
                return Err(Error::InvalidArgument(format!(
                    "clips differ in length ({t} and {n} frames); every clip of a request has the same length"
                )));
            }
            total = total.saturating_add(n);
        }
        if total > limits.max_frames {
            return Err(Error::InvalidArgument(format!(
                "{total} frames exceed the limit of {} per request",
                limits.max_frames
            )));
        }
        req.transform.validate(limits)
    }
}

impl Transform {
    /// Checks a transform's sizes and normalisation.
    pub fn validate(&self, limits: &Limits) -> Result<(), Error> {
        let transform = self;
        let side = |what: &str, v: u32| {
            if v == 0 || v > limits.max_side {
                Err(Error::InvalidArgument(format!(
                    "{what} {v} is outside 1..={}",
                    limits.max_side
                )))
            } else {
                Ok(())
            }
        };
        match transform.resize {
            Resize::Native => {}
            Resize::Exact { width, height } => {
                side("output width", width)?;
                side("output height", height)?;
            }
            Resize::ShortSide(s) => side("short side", s)?,
        }
        let spec = &transform.batch;
        if let Some((cw, ch)) = spec.crop {
            side("crop width", cw)?;
            side("crop height", ch)?;
        }
        if spec.dtype == batch::DType::U8 && (spec.mean != [0.0; 3] || spec.std != [1.0; 3]) {
            return Err(Error::InvalidArgument(
                "mean/std need a float dtype (float16 or float32)".into(),
            ));
        }
        // float32 output divides by std: a std whose reciprocal overflows f32 (1e-45) made every
        // value inf.
        if let Some(s) = spec
            .std
            .iter()
            .find(|s| !s.is_finite() || !(1.0 / **s).is_finite() || **s == 0.0)
        {
            return Err(Error::InvalidArgument(format!(
                "std {s} must be finite, non-zero and at least 1e-38 in magnitude"
            )));
        }
        if let Some(m) = spec.mean.iter().find(|m| !m.is_finite()) {
            return Err(Error::InvalidArgument(format!("mean {m} must be finite")));
        }
        // Every output value is (x / 255 - mean) / std for x in 0..=255: its extremes are at 0 and 255.
        // float16 holds magnitudes up to 65504; beyond, values silently became inf (std 1e-5: 1534 of
        // them in one batch).
        let bound = match spec.dtype {
            batch::DType::F16 => Some(65504.0f32),
            batch::DType::F32 => Some(f32::MAX),
            batch::DType::U8 => None,
        };
        if let Some(bound) = bound {
            for c in 0..3 {
                let (m, s) = (spec.mean[c], spec.std[c]);
                let worst = ((0.0 - m) / s).abs().max(((1.0 - m) / s).abs());
                if worst.is_nan() || worst > bound {
                    return Err(Error::InvalidArgument(format!(
                        "mean {m} and std {s} (channel {c}) give values up to {worst:e} in magnitude, over \
                         the {bound:e} {} holds",
                        if spec.dtype == batch::DType::F16 {
                            "float16"
                        } else {
                            "float32"
                        }
                    )));
                }
            }
        }
        Ok(())
    }

    /// Output size of a video's frames after rotation and resize, as the decoder must produce them.
    pub fn geometry(
        &self,
        index: &VideoIndex,
        video: &str,
        limits: &Limits,
    ) -> Result<Geometry, Error> {
        let transform = self;
        let rotation = if transform.rotate { index.rotation } else { 0 };
        let mirror = transform.rotate && index.mirror;
        let (dw, dh) = if rotation % 180 == 90 {
            (index.height, index.width)
        } else {
            (index.width, index.height)
        };
        let (ow, oh) = match transform.resize {
            Resize::Native => (dw, dh),
            Resize::Exact { width, height } => (width, height),
            Resize::ShortSide(s) => {
                let (s64, w64, h64) = (s as u64, dw as u64, dh as u64);
                // Round half up, at least 1 pixel.
                // Computed in u64 and clamped before narrowing, so extreme aspect ratios cannot wrap into a
                // size that passes the check below.
                let narrow = |v: u64| v.clamp(1, u32::MAX as u64) as u32;
                if dw <= dh {
                    (s, narrow((h64 * s64 * 2 + w64) / (2 * w64)))
                } else {
                    (narrow((w64 * s64 * 2 + h64) / (2 * h64)), s)
                }
            }
        };
        if ow > limits.max_side || oh > limits.max_side || ow == 0 || oh == 0 {
            return Err(Error::InvalidArgument(format!(
                "output size {ow}x{oh} for {video:?} is outside 1..={} per side",
                limits.max_side
            )));
        }
        let (sw, sh) = if rotation % 180 == 90 {
            (oh, ow)
        } else {
            (ow, oh)
        };
        Ok(Geometry {
            scaled_width: sw,
            scaled_height: sh,
            rotation,
            mirror,
            resized: !matches!(transform.resize, Resize::Native),
        })
    }
}

/// Frame numbers of a clip's positions in a video; errors name the position and the video.
pub fn resolve_positions(
    video: &str,
    index: &VideoIndex,
    positions: &Positions,
) -> Result<Vec<usize>, Error> {
    let n = index.frame_count();
    let check = |what: String, lookup: Lookup| {
        match lookup {
        Lookup::Frame(k) => Ok(k),
        Lookup::Lost => Err(Error::DataLoss(format!(
            "{what} of {video:?} is missing: the file is damaged or truncated ({n} of its {} frames are decodable)",
            index.declared_frames
        ))),
        Lookup::OutOfRange => Err(Error::OutOfRange(format!(
            "{what} is out of range for {video:?} ({n} frames, {:.3} s from {:.3} s)",
            index.duration_seconds(),
            index.frames.first().map_or(0.0, |f| index.seconds(f.pts))
        ))),
    }
    };
    match positions {
        Positions::Frames(frames) => frames
            .iter()
            .map(|&k| check(format!("frame {k}"), index.lookup_frame(k)))
            .collect(),
        Positions::Times(times) => times
            .iter()
            // Debug: 1e308 as such, not its 309 digits.
            .map(|&t| check(format!("time {t:?} s"), index.lookup_time(t)))
            .collect(),
    }
}

/// Bytes of one decoded frame of `g` (packed RGB24).
pub fn frame_bytes(g: Geometry) -> u64 {
    g.scaled_width as u64 * g.scaled_height as u64 * 3
}

/// Bytes of an array of `shape` in `dtype`, saturating at `u64::MAX` (never wrapping).
pub fn array_bytes(shape: &[u64], dtype: DType) -> u64 {
    let n = shape
        .iter()
        .try_fold(dtype.size() as u128, |acc, &d| acc.checked_mul(d as u128));
    n.map_or(u64::MAX, |n| u64::try_from(n).unwrap_or(u64::MAX))
}

/// `what`'s output array against `--max-output-bytes`: its bytes, or INVALID_ARGUMENT naming the shape.
pub fn check_output_bytes(
    what: &str,
    shape: &[u64],
    dtype: DType,
    limits: &Limits,
) -> Result<u64, Error> {
    let nbytes = array_bytes(shape, dtype);
    if nbytes > limits.max_output_bytes {
        return Err(Error::InvalidArgument(format!(
            "{what} of {nbytes} bytes (shape {shape:?}, {}) exceeds the limit of {} bytes (max-output-bytes)",
            match dtype {
                DType::U8 => "uint8",
                DType::F16 => "float16",
                DType::F32 => "float32",
            },
            limits.max_output_bytes
        )));
    }
    Ok(nbytes)
}

/// Output size in display orientation.
pub fn display_dims(g: Geometry) -> (u32, u32) {
    g.display_dims()
}
