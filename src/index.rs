//! Video index: per video, the table of frames in presentation order and the stream facts.
//!
//! Input: a file path and an optional stream index. Output: a [`VideoIndex`], shared read-only by every
//! request (the server caches them by file identity).
//!
//! Frame k is the k-th frame FFmpeg's decoder outputs for the stream in presentation order. The cheap way to
//! learn the table is one packet scan: every packet is one frame, its pts is the frame's pts. That holds for
//! well-formed files only, so the scan also checks each packet (pts present, not flagged discard or corrupt,
//! pts unique, NAL units of H.264/HEVC tiling the packet exactly, the read ending in a clean EOF). When any
//! check fails the table comes from a full decode instead ([`crate::decode::ffmpeg::scan_by_decoding`]):
//! slower, but by construction what the decoder emits. Files whose decoded frames lack pts or whose pts do
//! not increase can only be read from the start ([`SeekMode::FromStart`]).
//!
//! Damage inside coded data passes every packet check; the decoder finds it. Such a video is indexed
//! again with `force_decode` (the engine does this when a decode reports errors). A decode scan that meets
//! decoder errors makes the video [`SeekMode::FromStart`]: error concealment depends on what was decoded
//! before, so only decoding from the start gives every frame the pixels `ffmpeg -threads 1` gives it, the
//! same whichever frames a request asks for.

use std::path::Path;

use ff::codec::packet::Ref as _;
use ffmpeg_next as ff;

use crate::decode::ffmpeg as ffdec;

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

#[derive(Clone, Debug)]
pub struct VideoIndex {
    /// Container stream index.
    pub stream: usize,
    pub codec: String,
    pub pixel_format: String,
    /// Coded size (stored orientation).
    pub width: u32,
    pub height: u32,
    /// Display rotation, degrees clockwise: 0, 90, 180 or 270.
    pub rotation: u32,
    pub time_base: (i32, i32),
    pub avg_fps: f64,
    /// Frames in presentation order.
    pub frames: Vec<FrameEntry>,
    /// Indices of keyframes, ascending. Decoding may start at any of them.
    pub keyframes: Vec<usize>,
    /// Frames the container declares, when the file is truncated and holds fewer; else 0.
    pub declared_frames: u64,
    pub seek: SeekMode,
    pub method: IndexMethod,
    /// Length-prefix size of H.264 NAL units in packets (AVCC framing), when the stream is such; lets the
    /// decoder recognise disposable (non-reference) frames without decoding them.
    pub h264_nal_length: Option<usize>,
    /// The decode scan met decoder errors (damaged coded data).
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
        let i = self.keyframes.partition_point(|&kf| kf <= k);
        if i == 0 {
            0
        } else {
            self.keyframes[i - 1]
        }
    }

    /// Position of the frame with this pts, if the table has one.
    pub fn frame_of_pts(&self, pts: i64) -> Option<usize> {
        self.frames.binary_search_by(|f| f.pts.cmp(&pts)).ok()
    }

    /// Rough bytes held, for weighting the index cache.
    pub fn approx_bytes(&self) -> usize {
        256 + self.frames.len() * std::mem::size_of::<FrameEntry>() + self.keyframes.len() * 8
    }
}

/// One frame as the decode scan saw it.
#[derive(Clone, Copy, Debug)]
pub struct ScannedFrame {
    pub pts: Option<i64>,
    pub duration: i64,
    pub key: bool,
}

/// Builds the index of `path`'s stream (`stream` = container index, or FFmpeg's best video stream).
/// `force_decode` skips the packet-scan table and indexes by decoding (for videos found damaged).
pub fn build(
    path: &Path,
    stream: Option<usize>,
    force_decode: bool,
) -> Result<VideoIndex, IndexError> {
    let pstr = path.display().to_string();
    ffdec::init();
    let mut input = ff::format::input(&path).map_err(|e| IndexError::Open {
        path: pstr.clone(),
        reason: e.to_string(),
    })?;
    let st_index = ffdec::pick_stream(&input, stream).map_err(|detail| IndexError::NoVideo {
        path: pstr.clone(),
        detail,
    })?;
    let facts = ffdec::stream_facts(&input, st_index).map_err(|reason| IndexError::Corrupt {
        path: pstr.clone(),
        reason,
    })?;

    // One packet scan.
    let nal_len = facts.nal_length_size;
    let mut packets: Vec<(Option<i64>, i64, bool)> = Vec::new();
    let mut irregular: Option<String> = force_decode.then(|| "decode errors seen".to_owned());
    let mut truncated = false;
    let mut packet = ff::Packet::empty();
    loop {
        match ffdec::read_packet(&mut packet, &mut input) {
            Ok(()) => {}
            Err(ff::Error::Eof) => break,
            Err(e) => {
                truncated = true;
                irregular.get_or_insert_with(|| format!("read error: {e}"));
                break;
            }
        }
        if packet.stream() != st_index {
            continue;
        }
        let flags = packet.flags();
        if flags.contains(ff::packet::Flags::CORRUPT) {
            truncated = true;
            irregular.get_or_insert_with(|| "corrupt packet".into());
        }
        // SAFETY: `packet` wraps a valid AVPacket; reading its flags field has no side effects.
        let discard = unsafe { (*packet.as_ptr()).flags & ff::ffi::AV_PKT_FLAG_DISCARD } != 0;
        if discard {
            irregular.get_or_insert_with(|| "discarded packets (edit list)".into());
        }
        if let (Some(n), Some(data)) = (nal_len, packet.data()) {
            if !nal_units_tile(data, n) {
                irregular.get_or_insert_with(|| "malformed NAL unit sizes".into());
            }
        }
        if packet.pts().is_none() {
            irregular.get_or_insert_with(|| "packet without pts".into());
        }
        packets.push((packet.pts(), packet.duration(), packet.is_key()));
    }
    drop(input);

    let mut frames_in: Vec<ScannedFrame>;
    let method;
    if irregular.is_none() {
        let mut sorted: Vec<(i64, i64, bool)> = packets
            .iter()
            .map(|&(pts, dur, key)| (pts.unwrap_or(i64::MIN), dur, key))
            .collect();
        sorted.sort_by_key(|p| p.0);
        if sorted.windows(2).any(|w| w[0].0 == w[1].0) {
            irregular = Some("duplicate pts".into());
        }
        frames_in = sorted
            .into_iter()
            .map(|(pts, duration, key)| ScannedFrame {
                pts: Some(pts),
                duration,
                key,
            })
            .collect();
        method = IndexMethod::PacketScan;
    } else {
        frames_in = Vec::new();
        method = IndexMethod::DecodeScan;
    }
    let mut damaged = false;
    let method = if let Some(reason) = &irregular {
        tracing::debug!(path = %pstr, %reason, "packet scan irregular; indexing by decoding");
        let scan = ffdec::scan_by_decoding(path, st_index).map_err(|e| IndexError::Corrupt {
            path: pstr.clone(),
            reason: e.to_string(),
        })?;
        frames_in = scan.frames;
        damaged = scan.errors;
        IndexMethod::DecodeScan
    } else {
        method
    };
    if frames_in.is_empty() {
        return Err(IndexError::Corrupt {
            path: pstr,
            reason: "no decodable frames".into(),
        });
    }

    let avg_frame = if facts.avg_fps > 0.0 {
        (facts.time_base.1 as f64 / facts.time_base.0 as f64 / facts.avg_fps).round() as i64
    } else {
        1
    }
    .max(1);
    let seek = if !damaged
        && frames_in.iter().all(|f| f.pts.is_some())
        && frames_in.windows(2).all(|w| w[0].pts < w[1].pts)
    {
        SeekMode::ByPts
    } else {
        SeekMode::FromStart
    };
    // Fill missing pts (FromStart tables only: a missing pts makes a table FromStart) from the previous
    // frame plus its duration.
    let mut frames = Vec::with_capacity(frames_in.len());
    let mut prev_end: Option<i64> = None;
    for f in &frames_in {
        let dur = if f.duration > 0 {
            f.duration
        } else {
            avg_frame
        };
        // Real pts are kept as they are; only missing ones are synthesised.
        let pts = match (f.pts, prev_end) {
            (Some(p), _) => p,
            (None, Some(end)) => end,
            (None, None) => 0,
        };
        prev_end = Some(pts.saturating_add(dur));
        frames.push(FrameEntry {
            pts,
            duration: dur,
            key: f.key,
            stated_duration: f.duration.max(0),
        });
    }
    // Durations run until the next frame where the next frame is known.
    for i in 0..frames.len().saturating_sub(1) {
        let next = frames[i + 1].pts;
        if next > frames[i].pts {
            frames[i].duration = next.saturating_sub(frames[i].pts);
        }
    }
    let mut keyframes: Vec<usize> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| f.key)
        .map(|(i, _)| i)
        .collect();
    if keyframes.first() != Some(&0) {
        // Decoding can always start at the beginning of the file.
        keyframes.insert(0, 0);
    }
    let declared = facts.nb_frames.max(0) as u64;
    let declared_frames = if truncated && declared > frames.len() as u64 {
        declared
    } else {
        0
    };
    let h264_nal_length = if facts.codec == "h264" { nal_len } else { None };
    Ok(VideoIndex {
        damaged,
        h264_nal_length,
        stream: st_index,
        codec: facts.codec,
        pixel_format: facts.pixel_format,
        width: facts.width,
        height: facts.height,
        rotation: facts.rotation,
        time_base: facts.time_base,
        avg_fps: facts.avg_fps,
        frames,
        keyframes,
        declared_frames,
        seek,
        method,
    })
}

/// True when `data` (length-prefixed H.264 NAL units) holds coded slices and every one of them has
/// nal_ref_idc 0: the picture is referenced by no other, so skipping it changes no other frame.
pub fn h264_disposable(data: &[u8], n: usize) -> bool {
    let mut pos = 0usize;
    let mut slices = 0;
    while pos + n < data.len() {
        let size = data[pos..pos + n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | b as usize);
        let start = pos + n;
        if size == 0 || start + size > data.len() {
            return false;
        }
        let header = data[start];
        let nal_type = header & 0x1f;
        let ref_idc = (header >> 5) & 3;
        if (1..=5).contains(&nal_type) {
            if ref_idc != 0 || nal_type == 5 {
                return false;
            }
            slices += 1;
        }
        pos = start + size;
    }
    slices > 0
}

/// True when length-prefixed NAL units (AVCC/HVCC, `n`-byte big-endian sizes) cover `data` exactly.
pub fn nal_units_tile(data: &[u8], n: usize) -> bool {
    let mut pos = 0usize;
    while pos < data.len() {
        if pos + n > data.len() {
            return false;
        }
        let size = data[pos..pos + n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | b as usize);
        if size == 0 {
            return false;
        }
        pos = match (pos + n).checked_add(size) {
            Some(p) if p <= data.len() => p,
            _ => return false,
        };
    }
    true
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
            time_base: (1, 100),
            avg_fps: 10.0,
            frames,
            keyframes: keys.to_vec(),
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

    #[test]
    fn disposable_h264_pictures() {
        // Non-reference slice (nal_ref_idc 0, type 1) after an SEI: disposable.
        assert!(h264_disposable(
            &[0, 0, 0, 2, 0x06, 1, 0, 0, 0, 2, 0x01, 0x88],
            4
        ));
        // Reference P slice (nal_ref_idc 2): not.
        assert!(!h264_disposable(&[0, 0, 0, 2, 0x41, 0x9a], 4));
        // IDR: not. No slice at all: not.
        assert!(!h264_disposable(&[0, 0, 0, 2, 0x05, 0x88], 4));
        assert!(!h264_disposable(&[0, 0, 0, 2, 0x06, 1], 4));
        // Truncated: not.
        assert!(!h264_disposable(&[0, 0, 0, 9, 0x01, 0x88], 4));
    }

    #[test]
    fn nal_tiling() {
        assert!(nal_units_tile(&[0, 0, 0, 2, 9, 9, 0, 0, 0, 1, 7], 4));
        assert!(!nal_units_tile(&[0, 0, 0, 3, 9, 9], 4));
        assert!(!nal_units_tile(&[0xff, 0xff, 0xff, 0xff, 1], 4));
        assert!(!nal_units_tile(&[0, 0, 0, 1, 9, 0, 0], 4));
    }
}
