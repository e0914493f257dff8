//! Decoding: turns one GOP run of one video into RGB frames.
//!
//! Inputs: a video's path and [`crate::index::VideoIndex`], a [`GopRun`] (a keyframe and the frames wanted
//! after it) and a [`Geometry`] (output size and orientation). Outputs: one [`Frame`] per wanted frame,
//! packed RGB24, in display orientation unless the geometry says otherwise.
//!
//! Invariants: a backend emits exactly the wanted frames of a run, each once, identified by the index's
//! frame numbering (frame k = the k-th frame FFmpeg's decoder outputs in presentation order); a wanted frame
//! it cannot produce is an error naming that frame, never a silently substituted neighbour.
//!
//! Backends live one per module behind [`Backend`]: [`ffmpeg`] (CPU, libavcodec), `cuda` (NVDEC through
//! FFmpeg's CUDA hwaccel, with CPU fallback; the `cuda` Cargo feature; [`gpus`] resolves `--gpus`) and [`fake`] (deterministic
//! synthetic frames for tests that need no media); [`gulp`] decodes the stored JPEG frames of GulpIO
//! datasets; [`select`] picks each slot's backend from `--gpus` and wraps it in [`select::Routed`], which
//! sends GulpIO videos (by [`VideoSource::gulp`]) to [`gulp`]. [`fleet`] runs a backend on named OS threads,
//! with a watchdog that fails and replaces runs stuck past their deadline. Backends read the descriptor
//! the catalogue checked ([`VideoSource::file`]), never the path again. [`faults`] holds the test-only
//! hooks that stall or abort an open (debug builds only). [`pool`] keeps frame buffers for reuse; [`sink`] lets a run convert wanted frames
//! straight into the reply that waits for them.

pub mod cancel;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fake;
pub mod faults;
pub mod ffmpeg;
pub mod fleet;
pub mod gpus;
pub mod gulp;
pub mod pool;
pub mod resize;
pub mod select;
pub mod sink;

use std::path::PathBuf;
use std::sync::Arc;

use crate::index::VideoIndex;
pub use crate::plan::GopRun;

/// One decoded, converted frame: packed RGB24, rows of `width * 3` bytes, no padding.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Frame({}x{}, {} bytes)",
            self.width,
            self.height,
            self.data.len()
        )
    }
}

/// A frame's buffer goes back to the [`pool`] when its last reference drops (a frame evicted from the
/// cache, a bypassing frame once its batch is assembled), so the next decode reuses mapped pages.
impl Drop for Frame {
    fn drop(&mut self) {
        pool::give(std::mem::take(&mut self.data));
    }
}

impl Frame {
    /// Bytes the frame holds, for cache weighting.
    pub fn nbytes(&self) -> usize {
        self.data.len()
    }
}

/// How frames leave the decoder: size after scaling, in stored orientation, and whether the display
/// rotation is then applied. Part of the frame cache key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Scaled size before rotation (stored orientation). Equal to the coded size for native output.
    pub scaled_width: u32,
    pub scaled_height: u32,
    /// Clockwise rotation applied after scaling: 0, 90, 180 or 270.
    pub rotation: u32,
    /// After the rotation, flipped left-right (a mirrored display matrix).
    pub mirror: bool,
    /// The request asked for a size (even the video's own): frames go through the scale the CLI's
    /// `-vf scale=W:H:flags=bilinear` applies, which at the native size still differs from the plain
    /// `-pix_fmt rgb24` conversion for formats without a dedicated converter (10-bit, rotated 4:2:2).
    pub resized: bool,
}

impl Geometry {
    /// Whether frames leave the decoder as stored (no rotation, no flip).
    pub fn upright(self) -> bool {
        self.rotation == 0 && !self.mirror
    }

    /// Output size in display orientation (after the rotation).
    pub fn display_dims(self) -> (u32, u32) {
        if self.rotation % 180 == 90 {
            (self.scaled_height, self.scaled_width)
        } else {
            (self.scaled_width, self.scaled_height)
        }
    }
}

/// What a decode job needs to know about its video.
#[derive(Clone, Debug)]
pub struct VideoSource {
    pub path: PathBuf,
    /// The file as the catalogue checked and opened it (the descriptor decoders read, and the identity
    /// the crash journal records). None for GulpIO videos and for sources built by tools and tests from
    /// a trusted path, which backends then open by that path.
    pub file: Option<Arc<crate::dataset::CheckedFile>>,
    pub index: Arc<VideoIndex>,
    /// Set for a video of a GulpIO dataset: its frames are stored JPEGs, decoded by [`gulp`], not a
    /// video stream (`path` is then only a name).
    pub gulp: Option<crate::gulp::reader::GulpVideo>,
}

/// The outcome of decoding one run.
#[derive(Debug, Default)]
pub struct RunOutput {
    /// (frame index, frame), in index order.
    pub frames: Vec<(usize, Arc<Frame>)>,
    /// Wanted frames written straight into the run's [`sink::Sink`] instead (not in `frames`, unless
    /// the sink is shared), in index order.
    pub sunk: Vec<usize>,
    /// Frames the decoder produced, wanted or not.
    pub decoded: u64,
    /// Disposable frames (unwanted, referenced by nothing) whose packets were never decoded.
    pub skipped: u64,
    /// Where the run was decoded, for per-backend metrics.
    pub decoded_on: DecodedOn,
    /// Decoders this run opened (1 when its video was not open), and of those, how many were another
    /// video's decoder reused (`ffmpeg::reuse`) instead of a new one.
    pub decoders_opened: u64,
    pub decoders_reused: u64,
    /// The run stopped at the end of its time slice ([`cancel::yield_due`]) before its last wanted
    /// frame: the wanted frames not given are still to come, from a run of them that continues where
    /// this one stopped. Never set on a run without a slice.
    pub yielded: bool,
}

/// Where a run was decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodedOn {
    /// A CPU decode thread (FFmpeg in software, or stored JPEGs).
    #[default]
    Cpu,
    /// NVDEC, through FFmpeg's CUDA hwaccel.
    Gpu,
    /// A GPU decode thread that fell back to software decoding because NVDEC could not decode the video.
    CpuFallback,
}

#[derive(Debug, thiserror::Error, Clone)]
pub enum DecodeError {
    #[error("cannot open {path:?}: {reason}")]
    Open { path: PathBuf, reason: String },
    #[error("{path:?} has no decodable video stream{detail}")]
    NoVideo { path: PathBuf, detail: String },
    #[error("unsupported media {path:?}: {reason}")]
    Unsupported { path: PathBuf, reason: String },
    #[error("corrupt media {path:?}: frames {frames:?} could not be decoded{detail}")]
    MissingFrames {
        path: PathBuf,
        frames: Vec<usize>,
        detail: String,
    },
    #[error("decoder failure on {path:?}: {reason}")]
    Backend { path: PathBuf, reason: String },
    /// The decoder reported errors on a video whose table came from a clean packet scan: the file is
    /// damaged inside its coded data, so that table (and disposable-frame skipping) cannot be trusted.
    #[error("decode errors in {path:?} near frame {frame}")]
    Damaged { path: PathBuf, frame: usize },
    #[error("decode queue full ({0} runs waiting)")]
    Overloaded(usize),
    /// A run went past its deadline (`--decode-deadline`). `decoding`: it was still decoding frames
    /// then, `decoded` of them (a slow run: frames far from their keyframe, a loaded host); otherwise its
    /// read or decoder is stuck, and the file is refused for a while.
    #[error("{}", deadline_message(path, *seconds, *decoding, *decoded))]
    Deadline {
        path: PathBuf,
        seconds: f64,
        decoding: bool,
        decoded: u64,
    },
    /// No decode thread can make progress: every one is stuck past its deadline.
    #[error("no decode thread can make progress: {0}")]
    Stalled(String),
    #[error("decode fleet is shutting down")]
    ShuttingDown,
    /// The run was stopped between packets ([`cancel`]): its deadline passed (its waiters were told
    /// [`DecodeError::Deadline`] then) or nobody waits for it any more.
    #[error("decoding {path:?} was stopped: its deadline passed or nobody waits for it")]
    Cancelled { path: PathBuf },
}

/// What a run past its deadline tells its requests: a stuck file is refused for a while, a slow run
/// only fails.
fn deadline_message(path: &std::path::Path, seconds: f64, decoding: bool, decoded: u64) -> String {
    if decoding {
        format!("decoding {path:?} took longer than the {seconds} s deadline (--decode-deadline) while still decoding ({decoded} frames decoded): the frames asked are too far from a keyframe to decode in time (a GOP of thousands of frames, or a host too loaded); the file is still served")
    } else {
        format!("decoding {path:?} took longer than the {seconds} s deadline (--decode-deadline) and decoded no frame in the last quarter of it: its read or decoder is stuck (a hung network file system, a FIFO, a pathological file); the file is not tried again for a while unless it changes")
    }
}

/// A decoder backend: decodes runs of one video at a time. Implementations keep whatever per-video state
/// (open demuxers, decoder contexts) makes consecutive runs cheap; one instance lives on one thread.
///
/// `sink`: where wanted frames that have a place there go instead of into `RunOutput::frames` (listed in
/// `RunOutput::sunk`); a backend may ignore it, and must emit a frame whose place it does not take as a
/// [`Frame`] as usual, and also as one when the sink is [`sink::Sink::shared`].
pub trait Backend {
    fn decode_run(
        &mut self,
        source: &VideoSource,
        run: &GopRun,
        geometry: Geometry,
        sink: Option<&sink::Sink>,
    ) -> Result<RunOutput, DecodeError>;

    /// Whether a run can crash the host, not just this process (it drives a device through a kernel
    /// driver): the crash journal then makes the run's record durable before it starts.
    fn drives_a_device(&self) -> bool {
        false
    }

    /// The backend's thread has had no run for a while: let go of the files it keeps open whose names
    /// were all removed (a deleted video's space stays allocated while anything holds it open).
    fn idle(&mut self) {}
}

/// Where the sample at (x, y) of a `w`x`h` image goes when the image is rotated clockwise by `rotation`
/// (0, 90, 180 or 270) and then, with `mirror`, flipped left-right: as FFmpeg's `transpose`, `hflip` and
/// `vflip` autorotation filters move it.
#[inline]
pub fn oriented(
    x: usize,
    y: usize,
    w: usize,
    h: usize,
    rotation: u32,
    mirror: bool,
) -> (usize, usize) {
    let (ox, oy, ow) = match rotation {
        90 => (h - 1 - y, x, h),
        180 => (w - 1 - x, h - 1 - y, w),
        270 => (y, w - 1 - x, h),
        _ => (x, y, w),
    };
    if mirror {
        (ow - 1 - ox, oy)
    } else {
        (ox, oy)
    }
}

/// Rotates a packed RGB24 image clockwise by 0, 90, 180 or 270 degrees and, with `mirror`, flips it
/// left-right ([`oriented`]). Lossless, so it equals FFmpeg's autorotation filters exactly.
pub fn rotate_rgb(frame: Frame, rotation: u32, mirror: bool) -> Frame {
    if !rotation.is_multiple_of(90) || (rotation.is_multiple_of(360) && !mirror) {
        return frame;
    }
    let (w, h) = (frame.width as usize, frame.height as usize);
    let (ow, oh) = if rotation % 180 == 90 { (h, w) } else { (w, h) };
    let src = &frame.data;
    let mut out = pool::take(src.len());
    out.resize(src.len(), 0);
    for y in 0..h {
        for x in 0..w {
            let (ox, oy) = oriented(x, y, w, h, rotation, mirror);
            let s = (y * w + x) * 3;
            let d = (oy * ow + ox) * 3;
            out[d..d + 3].copy_from_slice(&src[s..s + 3]);
        }
    }
    drop(frame); // its buffer back to the pool
    Frame {
        width: ow as u32,
        height: oh as u32,
        data: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(w: u32, h: u32) -> Frame {
        let data = (0..w * h).flat_map(|i| [i as u8, 0, 0]).collect();
        Frame {
            width: w,
            height: h,
            data,
        }
    }

    fn px(f: &Frame, x: u32, y: u32) -> u8 {
        f.data[((y * f.width + x) * 3) as usize]
    }

    #[test]
    fn rotations_move_corners_where_ffmpeg_transpose_does() {
        // 3x2 image, values 0..6 row-major: [0 1 2; 3 4 5].
        let cw = rotate_rgb(numbered(3, 2), 90, false);
        assert_eq!((cw.width, cw.height), (2, 3));
        // transpose=clock: [3 0; 4 1; 5 2].
        let got: Vec<u8> = (0..3)
            .flat_map(|y| (0..2).map(move |x| (x, y)))
            .map(|(x, y)| px(&cw, x, y))
            .collect();
        assert_eq!(got, vec![3, 0, 4, 1, 5, 2]);
        let ccw = rotate_rgb(numbered(3, 2), 270, false);
        let got: Vec<u8> = (0..3)
            .flat_map(|y| (0..2).map(move |x| (x, y)))
            .map(|(x, y)| px(&ccw, x, y))
            .collect();
        assert_eq!(got, vec![2, 5, 1, 4, 0, 3]);
        let r180 = rotate_rgb(numbered(3, 2), 180, false);
        let got: Vec<u8> = (0..6).map(|i| r180.data[i * 3]).collect();
        assert_eq!(got, vec![5, 4, 3, 2, 1, 0]);
    }

    fn pixels(f: &Frame) -> Vec<u8> {
        (0..f.height)
            .flat_map(|y| (0..f.width).map(move |x| (x, y)))
            .map(|(x, y)| px(f, x, y))
            .collect()
    }

    #[test]
    fn mirrored_orientations_move_corners_where_ffmpeg_flips_do() {
        // 3x2 image [0 1 2; 3 4 5]. hflip: [2 1 0; 5 4 3]; vflip (a half turn flipped): [3 4 5; 0 1 2].
        let hflip = rotate_rgb(numbered(3, 2), 0, true);
        assert_eq!((hflip.width, hflip.height), (3, 2));
        assert_eq!(pixels(&hflip), vec![2, 1, 0, 5, 4, 3]);
        assert_eq!(
            pixels(&rotate_rgb(numbered(3, 2), 180, true)),
            vec![3, 4, 5, 0, 1, 2]
        );
        // transpose=cclock_flip (the transpose): [0 3; 1 4; 2 5]; clock_flip: [5 2; 4 1; 3 0].
        let t = rotate_rgb(numbered(3, 2), 90, true);
        assert_eq!((t.width, t.height), (2, 3));
        assert_eq!(pixels(&t), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(
            pixels(&rotate_rgb(numbered(3, 2), 270, true)),
            vec![5, 2, 4, 1, 3, 0]
        );
        // Upright is left alone.
        assert_eq!(
            pixels(&rotate_rgb(numbered(3, 2), 0, false)),
            vec![0, 1, 2, 3, 4, 5]
        );
    }
}
