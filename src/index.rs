//! Video index: per video, the table of frames in presentation order and the stream facts.
//!
//! Input: a file path and an optional stream index. Output: a [`VideoIndex`], shared read-only by every
//! request (the server caches them by file identity).
//!
//! Frame k is the k-th frame FFmpeg's decoder outputs for the stream in presentation order. The cheap way to
//! learn the table is one packet scan: every packet is one frame, its pts is the frame's pts. That holds for
//! well-formed files only, so the scan also checks each packet (pts present, not flagged discard or corrupt,
//! pts unique, NAL units of H.264/HEVC tiling the packet exactly, the read ending in a clean EOF). When any
//! check fails the table comes from a full decode instead ([`crate::decode::ffmpeg::scan_by_decoding`]; both live in `decode::ffmpeg::scan`: this module holds no FFmpeg):
//! slower, but by construction what the decoder emits. Files whose decoded frames lack pts or whose pts do
//! not increase can only be read from the start ([`SeekMode::FromStart`]).
//!
//! The scan also decodes the start of the stream, until the first frame comes out: a decoder that
//! rejects or drops leading packets (a stream cut mid-GOP), or whose first frame is not the table's first,
//! sends the table to a decode scan, and the first frame's size is the video's size ([`VideoIndex::width`]).
//! Packets flagged corrupt, lying past the end of the file, or all zero bytes (data lost) mark the file
//! truncated: the container's declared count is kept ([`VideoIndex::declared_frames`]).
//!
//! Damage inside coded data passes every packet check; the decoder finds it. Such a video is indexed
//! again with `force_decode` (the engine does this when a decode reports errors). A decode scan that meets
//! decoder errors that can change output pixels (a frame flagged damaged, a rejected packet followed by
//! accepted ones; not rejected packets before the first accepted one or after the last) makes the video
//! [`SeekMode::FromStart`]: error concealment depends on what was decoded before, so only decoding from the start gives every frame the pixels `ffmpeg -threads 1` gives it, the
//! same whichever frames a request asks for.

pub mod table;

pub use table::{Frames, Keyframes};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameEntry {
    /// Presentation timestamp in the stream time base.
    pub pts: i64,
    /// Until the next frame's pts (the last frame: its packet duration, else the average frame duration).
    pub duration: i64,
    pub key: bool,
    /// The duration the stream states for this frame (its packet's, or the decoded frame's; 0 when none
    /// is stated): what ffprobe and TorchCodec report as the frame's duration.
    pub stated_duration: i64,
}

/// How a decoder finds frame k.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekMode {
    /// Seek to the keyframe's pts, then match decoded frames by pts.
    ByPts,
    /// Decode from the start of the file, counting frames.
    FromStart,
}

/// How the table was built (reported in logs and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexMethod {
    PacketScan,
    DecodeScan,
    /// Frames stored one by one (a GulpIO dataset): the table is the stored records.
    Stored,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VideoIndex {
    /// Container stream index.
    pub stream: usize,
    pub codec: String,
    pub pixel_format: String,
    /// Size of the first decoded frame, stored orientation (the container's declared size when none
    /// decoded while indexing): the CLI outputs every frame at it, scaling frames of other sizes.
    pub width: u32,
    pub height: u32,
    /// Display rotation, degrees clockwise: 0, 90, 180 or 270.
    pub rotation: u32,
    /// After the rotation the picture is flipped left-right: the display matrix mirrors.
    pub mirror: bool,
    pub time_base: (i32, i32),
    pub avg_fps: f64,
    /// Frames in presentation order (vectors, or a store record's columns read in place).
    pub frames: Frames,
    /// Indices of keyframes, ascending. Decoding may start at any of them.
    pub keyframes: Keyframes,
    /// Frames the container declares (or, in a damaged file, its packets), when the file is truncated
    /// or damaged and fewer decode; else 0.
    pub declared_frames: u64,
    pub seek: SeekMode,
    pub method: IndexMethod,
    /// Length-prefix size of H.264 NAL units in packets (AVCC framing), when the stream is such; lets the
    /// decoder recognise disposable (non-reference) frames without decoding them.
    pub h264_nal_length: Option<usize>,
    /// The decode scan met decoder errors that can change output pixels (damaged coded data).
    pub damaged: bool,
}

#[derive(Debug, thiserror::Error, Clone)]
pub enum IndexError {
    #[error("cannot open {path:?}: {reason}")]
    Open { path: String, reason: String },
    #[error("{path:?} has no video stream{detail}")]
    NoVideo { path: String, detail: String },
    #[error("corrupt media {path:?}: {reason}")]
    Corrupt { path: String, reason: String },
    /// Frames over the pixel bound (`--max-side` squared): refused before anything is decoded, and not
    /// remembered (a daemon with a larger bound decodes the file).
    #[error("{path:?}: {reason}")]
    TooLarge { path: String, reason: String },
}

/// Where a requested position lies relative to the table.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Frame(usize),
    /// Declared by the container but not present in the (truncated) file.
    Lost,
    OutOfRange,
}

impl VideoIndex {
    /// Whether the video's health must come from a whole decode ([`crate::check::health_of`]) before a
    /// stream places clips on it: its table met decoder errors, or the file lacks frames its header
    /// declares (cut short: its last frames may come from packets cut in two, which the decoder
    /// conceals without an error, and `vserve index` called such a file whole where `vserve check`
    /// found its first bad frame: probe C).
    pub fn needs_health_check(&self) -> bool {
        self.damaged || self.declared_frames > 0
    }

    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }

    pub fn seconds(&self, pts: i64) -> f64 {
        pts as f64 * self.time_base.0 as f64 / self.time_base.1 as f64
    }

    /// From the first frame's pts to the end of the last frame.
    pub fn duration_seconds(&self) -> f64 {
        match (self.frames.first(), self.frames.last()) {
            (Some(first), Some(last)) => self.seconds(
                last.pts
                    .saturating_add(last.duration)
                    .saturating_sub(first.pts),
            ),
            _ => 0.0,
        }
    }

    /// Size after display rotation.
    pub fn display_size(&self) -> (u32, u32) {
        if self.rotation % 180 == 90 {
            (self.height, self.width)
        } else {
            (self.width, self.height)
        }
    }

    pub fn lookup_frame(&self, k: u64) -> Lookup {
        if (k as usize) < self.frames.len() && k <= usize::MAX as u64 {
            Lookup::Frame(k as usize)
        } else if k < self.declared_frames {
            Lookup::Lost
        } else {
            Lookup::OutOfRange
        }
    }

    /// The frame displayed at `t` seconds: the last frame whose pts <= t, if t is before the end of the last
    /// frame.
    pub fn lookup_time(&self, t: f64) -> Lookup {
        let (Some(first), Some(last)) = (self.frames.first(), self.frames.last()) else {
            return Lookup::OutOfRange;
        };
        if !t.is_finite() || t < self.seconds(first.pts) {
            return Lookup::OutOfRange;
        }
        if t >= self.seconds(last.pts.saturating_add(last.duration)) {
            return if self.declared_frames > self.frames.len() as u64 {
                Lookup::Lost
            } else {
                Lookup::OutOfRange
            };
        }
        if self.seek == SeekMode::FromStart {
            // Tables read from the start may have pts that do not ascend (damaged or missing timestamps):
            // the frame with the greatest pts <= t, the earliest of equals.
            let best = self
                .frames
                .iter()
                .enumerate()
                .filter(|(_, f)| self.seconds(f.pts) <= t)
                .max_by_key(|(i, f)| (f.pts, std::cmp::Reverse(*i)))
                .map_or(0, |(i, _)| i);
            return Lookup::Frame(best);
        }
        // Seekable tables ascend strictly in pts.
        let after = self.frames.partition_point(|f| self.seconds(f.pts) <= t);
        Lookup::Frame(after.saturating_sub(1))
    }

    /// The keyframe a decode of frame k starts from.
    pub fn keyframe_before(&self, k: usize) -> usize {
        if self.seek == SeekMode::FromStart {
            return 0;
        }
        let i = self.keyframes.count_at_or_before(k);
        if i == 0 {
            0
        } else {
            self.keyframes.at(i - 1)
        }
    }

    /// Position of the frame with this pts, if the table has one.
    pub fn frame_of_pts(&self, pts: i64) -> Option<usize> {
        let k = self.frames.partition_point(|f| f.pts < pts);
        (k < self.frames.len() && self.frames.at(k).pts == pts).then_some(k)
    }

    /// Rough bytes held, for weighting the index cache: heap bytes, and 8 KiB for a mapped record (the
    /// kernel's cost of one mapping, rounded up so that the default 256 MiB cache holds at most 32,768
    /// mappings, half of the usual `vm.max_map_count`).
    pub fn approx_bytes(&self) -> usize {
        let keyframes = if self.frames.is_packed() {
            0
        } else {
            self.keyframes.len() * 8
        };
        let mapped = if self.frames.is_mapped() { 8192 } else { 0 };
        256 + self.codec.len()
            + self.pixel_format.len()
            + self.frames.heap_bytes()
            + keyframes
            + mapped
    }
}

/// Tests' tables: `frames` frames of 2x2 H.264 at `fps`, frame k at pts k (time base 1/`fps`), keyframes
/// at `keyframes`, packet-scanned and seekable by pts. Tests change what they need with struct update.
#[cfg(test)]
pub fn uniform(frames: usize, keyframes: &[usize], fps: i32) -> VideoIndex {
    VideoIndex {
        stream: 0,
        codec: "h264".into(),
        pixel_format: "yuv420p".into(),
        width: 2,
        height: 2,
        rotation: 0,
        mirror: false,
        time_base: (1, fps),
        avg_fps: fps as f64,
        frames: (0..frames)
            .map(|k| FrameEntry {
                pts: k as i64,
                duration: 1,
                key: keyframes.contains(&k),
                stated_duration: 1,
            })
            .collect(),
        keyframes: keyframes.to_vec().into(),
        declared_frames: 0,
        seek: SeekMode::ByPts,
        method: IndexMethod::PacketScan,
        h264_nal_length: None,
        damaged: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(pts: &[i64], keys: &[usize]) -> VideoIndex {
        let frames: Vec<FrameEntry> = pts
            .iter()
            .enumerate()
            .map(|(i, &p)| FrameEntry {
                pts: p,
                duration: 10,
                key: keys.contains(&i),
                stated_duration: 10,
            })
            .collect();
        VideoIndex {
            stream: 0,
            codec: "h264".into(),
            pixel_format: "yuv420p".into(),
            width: 4,
            height: 2,
            rotation: 0,
            mirror: false,
            time_base: (1, 100),
            avg_fps: 10.0,
            frames: frames.into(),
            keyframes: keys.to_vec().into(),
            declared_frames: 0,
            seek: SeekMode::ByPts,
            method: IndexMethod::PacketScan,
            h264_nal_length: None,
            damaged: false,
        }
    }

    #[test]
    fn time_lookup_picks_the_frame_displayed_at_t() {
        let idx = table(&[0, 10, 20, 30], &[0]);
        assert_eq!(idx.lookup_time(0.0), Lookup::Frame(0));
        assert_eq!(idx.lookup_time(0.099), Lookup::Frame(0));
        assert_eq!(idx.lookup_time(0.1), Lookup::Frame(1));
        assert_eq!(idx.lookup_time(0.35), Lookup::Frame(3));
        assert_eq!(idx.lookup_time(0.4), Lookup::OutOfRange);
        assert_eq!(idx.lookup_time(-0.01), Lookup::OutOfRange);
        assert_eq!(idx.lookup_time(f64::NAN), Lookup::OutOfRange);
    }

    #[test]
    fn keyframe_before_and_truncation() {
        let mut idx = table(&[0, 10, 20, 30, 40], &[0, 3]);
        assert_eq!(idx.keyframe_before(2), 0);
        assert_eq!(idx.keyframe_before(3), 3);
        assert_eq!(idx.keyframe_before(4), 3);
        idx.declared_frames = 9;
        assert_eq!(idx.lookup_frame(4), Lookup::Frame(4));
        assert_eq!(idx.lookup_frame(5), Lookup::Lost);
        assert_eq!(idx.lookup_frame(9), Lookup::OutOfRange);
        idx.seek = SeekMode::FromStart;
        assert_eq!(idx.keyframe_before(4), 0);
    }

    #[test]
    fn time_lookup_without_ascending_pts() {
        let mut idx = table(&[0, 20, 10, 30], &[0]);
        idx.seek = SeekMode::FromStart;
        assert_eq!(idx.lookup_time(0.15), Lookup::Frame(2));
        assert_eq!(idx.lookup_time(0.25), Lookup::Frame(1));
        assert_eq!(idx.lookup_time(0.35), Lookup::Frame(3));
    }
}
