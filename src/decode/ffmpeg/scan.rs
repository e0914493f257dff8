//! Building a video's frame table with FFmpeg: one packet scan that checks every packet and decodes the
//! start of the stream, or, when any check fails, a full decode ([`scan_by_decoding`]). The table itself
//! and its lookups are [`crate::index`], which knows nothing of FFmpeg.
//!
//! Both read only the chosen stream, as the FFmpeg CLI does ([`read_only_stream`]), and stop at the
//! first read error, where the CLI stops too. [`scan_by_decoding`] is also the whole-file health check:
//! what the decoder outputs, whether and where it reported errors, and why reading stopped.

use std::path::Path;

use ff::codec::packet::Ref as _;
use ffmpeg_next as ff;

use super::h264::{h264_key_picture, nal_units_tile};
use super::info::{init, pick_stream, read_only_stream, stream_facts};
use super::open::open_input;
use super::open_decoder;
use crate::dataset::CheckedFile;
use crate::decode::faults::Stage;
use crate::decode::DecodeError;
use crate::index::{FrameEntry, IndexError, IndexMethod, SeekMode, VideoIndex};

/// Reads the next packet into `packet`, releasing the one it held first. `ff::Packet::read` calls
/// `av_read_frame`, which overwrites the packet without unreferencing its previous buffer: reusing one
/// packet across reads leaked every packet's data (measured: ~0.75 MB per index build of a 10 s clip).
pub(crate) fn read_packet(
    packet: &mut ff::Packet,
    input: &mut ff::format::context::Input,
) -> Result<(), ff::Error> {
    // SAFETY: `packet` wraps a valid AVPacket; av_packet_unref frees its buffer reference (if any) and
    // leaves it blank, as av_read_frame expects.
    unsafe { ff::ffi::av_packet_unref(ff::packet::Mut::as_mut_ptr(packet)) };
    packet.read(input)
}

/// What decoding a whole stream found: the frames `ffmpeg -threads 1 -i F` outputs for it, in output
/// order, and the decoder's complaints.
#[derive(Debug)]
pub struct DecodeScan {
    pub frames: Vec<ScannedFrame>,
    /// Decoder errors that can change the pixels of frames it output: a frame flagged damaged, or a
    /// rejected packet followed by packets the decoder accepted. Packets rejected before the decoder
    /// accepted any (the undecodable start of a stream cut mid-GOP) or after the last one it accepted
    /// (a truncated last packet) change no output frame and do not count.
    pub damaged: bool,
    /// Frames output before the decoder's first error of any kind (a rejected packet or a damaged
    /// frame); None when it reported none. Where a health check says the damage begins.
    pub first_error: Option<usize>,
    /// Size of the first frame output: the CLI outputs every frame at this size.
    pub size: Option<(u32, u32)>,
    /// Why reading stopped before a clean end of file, if it did.
    pub read_error: Option<String>,
}

impl DecodeScan {
    /// Takes every frame the decoder has ready.
    fn take_frames(&mut self, decoder: &mut ff::decoder::Video, frame: &mut ff::frame::Video) {
        while decoder.receive_frame(frame).is_ok() {
            if frame_damaged(frame) {
                self.damaged = true;
                self.first_error.get_or_insert(self.frames.len());
            }
            self.size.get_or_insert((frame.width(), frame.height()));
            // SAFETY: `frame` holds a frame just returned by the decoder.
            let duration = unsafe { (*frame.as_ptr()).pkt_duration };
            // The frame's pts, else its best-effort timestamp, as the CLI numbers its frames: AVI
            // gives no pts to B-frame streams' packets, and frames from the decoder's reorder delay
            // are stamped with the dts of the packet that let them out (the first H.264 frame of
            // h264_bf.avi at 0.08 s, not 0).
            self.frames.push(ScannedFrame {
                pts: frame.pts().or(frame.timestamp()),
                duration,
                key: frame.is_key(),
            });
        }
    }
}

impl DecodeScan {
    /// Damage the decoder only logged (HEVC slices it concealed, [`super::info::decoder_errors`]) since
    /// the count was `before`.
    fn note_logged_errors(&mut self, before: u64) {
        if super::info::decoder_errors() > before {
            self.damaged = true;
            self.first_error.get_or_insert(self.frames.len());
        }
    }
}

/// True when the decoder flagged this frame as damaged (concealment active, or marked corrupt).
pub(super) fn frame_damaged(frame: &ff::frame::Video) -> bool {
    // SAFETY: `frame` holds a frame just returned by the decoder; these are plain fields.
    unsafe {
        let f = &*frame.as_ptr();
        f.decode_error_flags != 0 || (f.flags & ff::ffi::AV_FRAME_FLAG_CORRUPT) != 0
    }
}

/// Decodes all of stream `index` of `file`: the table of what the decoder really outputs, and where it
/// met errors. One decoder thread, as every run decodes, so concealment of damaged data is the same.
pub fn scan_by_decoding(file: &CheckedFile, index: usize) -> Result<DecodeScan, DecodeError> {
    init();
    let path = file.path.as_path();
    let mut input = open_input(file, true, Stage::Index).map_err(|e| DecodeError::Open {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    read_only_stream(&mut input, index);
    let mut decoder =
        open_decoder(&input, index, 1, None).map_err(|reason| DecodeError::Unsupported {
            path: path.to_owned(),
            reason,
        })?;
    let mut scan = DecodeScan {
        frames: Vec::new(),
        damaged: false,
        first_error: None,
        size: None,
        read_error: None,
    };
    let mut frame = ff::frame::Video::empty();
    let mut packet = ff::Packet::empty();
    let mut accepted_any = false;
    // A packet was rejected after the decoder had accepted some: damage if any accepted packet follows.
    let mut rejected_since_accepted = false;
    loop {
        match read_packet(&mut packet, &mut input) {
            Ok(()) => {}
            Err(ff::Error::Eof) => break,
            Err(e) => {
                scan.read_error = Some(e.to_string());
                break;
            }
        }
        if packet.stream() != index {
            continue;
        }
        let errors = super::info::decoder_errors();
        match decoder.send_packet(&packet) {
            Ok(()) => {
                scan.damaged |= rejected_since_accepted;
                accepted_any = true;
            }
            Err(e) => {
                scan.first_error.get_or_insert(scan.frames.len());
                rejected_since_accepted |= accepted_any;
                tracing::trace!(path = %path.display(), error = %e, "packet rejected during scan");
            }
        }
        scan.take_frames(&mut decoder, &mut frame);
        scan.note_logged_errors(errors);
    }
    let errors = super::info::decoder_errors();
    let _ = decoder.send_eof();
    scan.take_frames(&mut decoder, &mut frame);
    scan.note_logged_errors(errors);
    Ok(scan)
}

/// One frame as the decode scan saw it.
#[derive(Clone, Copy, Debug)]
pub struct ScannedFrame {
    pub pts: Option<i64>,
    pub duration: i64,
    pub key: bool,
}

/// The start of the stream, decoded alongside the packet scan until the decoder outputs its first
/// frame: that frame's size is the size of every output frame (the CLI scales later frames of another
/// size to it), and its pts proves that the decoder begins where the table does. A stream cut mid-GOP
/// begins with packets the decoder rejects or drops, which a packet table would count as frames.
struct StartCheck {
    /// None when no decoder opens (the table stays a packet table; decoding reports it) or once the
    /// first frame is out.
    decoder: Option<ff::decoder::Video>,
    available: bool,
    frame: ff::frame::Video,
    /// A packet was rejected before the first frame came out.
    rejected: bool,
    first: Option<FirstFrame>,
}

#[derive(Clone, Copy, Debug)]
struct FirstFrame {
    /// The frame's pts, else its best-effort timestamp (as decoding matches frames to the table).
    pts: Option<i64>,
    width: u32,
    height: u32,
    damaged: bool,
}

impl StartCheck {
    fn new(input: &ff::format::context::Input, index: usize) -> StartCheck {
        let decoder = open_decoder(input, index, 1, None)
            .map_err(|reason| tracing::trace!(%reason, "no decoder for the start check"))
            .ok();
        StartCheck {
            available: decoder.is_some(),
            decoder,
            frame: ff::frame::Video::empty(),
            rejected: false,
            first: None,
        }
    }

    fn feed(&mut self, packet: &ff::Packet) {
        let Some(decoder) = self.decoder.as_mut() else {
            return;
        };
        if decoder.send_packet(packet).is_err() {
            self.rejected = true;
        }
        self.receive();
    }

    fn receive(&mut self) {
        let Some(decoder) = self.decoder.as_mut() else {
            return;
        };
        if decoder.receive_frame(&mut self.frame).is_ok() {
            let f = &self.frame;
            self.first = Some(FirstFrame {
                pts: f.pts().or(f.timestamp()),
                width: f.width(),
                height: f.height(),
                damaged: frame_damaged(f),
            });
            // Done: the rest of the scan only reads packets.
            self.decoder = None;
        }
    }

    /// Drains the decoder (a stream shorter than its reorder delay) and says why, if at all, the table
    /// cannot be the packets': `first_pts` is the table's first pts.
    fn finish(&mut self, first_pts: Option<i64>) -> Option<String> {
        if let Some(decoder) = self.decoder.as_mut() {
            let _ = decoder.send_eof();
        }
        self.receive();
        if !self.available {
            return None;
        }
        match self.first {
            None => Some("the decoder outputs no frame".into()),
            Some(f) if self.rejected || f.damaged => {
                Some("decode errors before the first frame".into())
            }
            Some(f) if f.pts != first_pts => Some(format!(
                "the decoder's first frame (pts {:?}) is not the table's first (pts {first_pts:?})",
                f.pts
            )),
            Some(_) => None,
        }
    }
}

/// Builds the index of the file at a trusted `path` (tools and tests; the daemon opens client paths
/// through [`crate::dataset::Dataset::open`] and calls [`build_index_of`]).
pub fn build_index(
    path: &Path,
    stream: Option<usize>,
    force_decode: bool,
) -> Result<VideoIndex, IndexError> {
    let file = CheckedFile::open_trusted(path).map_err(|e| IndexError::Open {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    build_index_of(&file, stream, force_decode)
}

/// `file` opened (with its stream info) and the index of its stream (`stream` = container index, or
/// FFmpeg's best video stream), for the index and for `vserve check` alike. A video cut short is media
/// whose data is lost ([`IndexError::Corrupt`], DATA_LOSS), not a file vserve cannot read: one the
/// demuxer finds truncated, or an MP4 cut inside its index, which opens with no track at all.
pub(super) fn open_stream(
    file: &CheckedFile,
    stream: Option<usize>,
) -> Result<(ff::format::context::Input, usize), IndexError> {
    init();
    let path = || file.path.display().to_string();
    let input = open_input(file, true, Stage::Index).map_err(|e| match e {
        super::open::OpenError::Truncated(_) => IndexError::Corrupt {
            path: path(),
            reason: e.to_string(),
        },
        super::open::OpenError::TooLarge(_) => IndexError::TooLarge {
            path: path(),
            reason: e.to_string(),
        },
        e => IndexError::Open {
            path: path(),
            reason: e.to_string(),
        },
    })?;
    let index =
        pick_stream(&input, stream).map_err(|detail| match super::open::iso_truncation(file) {
            Some(how) => IndexError::Corrupt {
                path: path(),
                reason: format!("truncated: {how}"),
            },
            None => IndexError::NoVideo {
                path: path(),
                detail,
            },
        })?;
    Ok((input, index))
}

/// Builds the index of `file`'s stream (`stream` = container index, or FFmpeg's best video stream).
/// `force_decode` skips the packet-scan table and indexes by decoding (for videos found damaged).
pub fn build_index_of(
    file: &CheckedFile,
    stream: Option<usize>,
    force_decode: bool,
) -> Result<VideoIndex, IndexError> {
    let pstr = file.path.display().to_string();
    let (mut input, st_index) = open_stream(file, stream)?;
    let facts = stream_facts(&input, st_index).map_err(|reason| IndexError::Corrupt {
        path: pstr.clone(),
        reason,
    })?;
    // Refused before anything is decoded (the decoders' own `max_pixels` stops stream probing too).
    let limit = super::open::max_pixels();
    if u64::from(facts.width) * u64::from(facts.height) > limit {
        return Err(IndexError::TooLarge {
            path: pstr,
            reason: format!(
                "frames too large: stream {st_index} has frames of {}x{}, over the {limit} pixels this daemon decodes (--max-side squared)",
                facts.width, facts.height
            ),
        });
    }
    read_only_stream(&mut input, st_index);
    // Frames the decoder may hold back to reorder (0: it outputs each frame as decoded, in packet order).
    let reorder_delay = input.stream(st_index).map_or(0, |st| {
        // SAFETY: codecpar of a stream of an open input: a plain struct FFmpeg filled in.
        unsafe { (*st.parameters().as_ptr()).video_delay }
    });
    // The size of the open file (fstat when it was opened), not of whatever the path names now.
    let file_len = Some(file.size);

    // One packet scan, decoding the start of the stream on the way.
    let nal_len = facts.nal_length_size;
    let h264 = facts.codec == "h264";
    let mut packets: Vec<(Option<i64>, i64, bool)> = Vec::new();
    let mut irregular: Option<String> = force_decode.then(|| "decode errors seen".to_owned());
    let mut truncated = false;
    let mut start = StartCheck::new(&input, st_index);
    let mut packet = ff::Packet::empty();
    loop {
        match read_packet(&mut packet, &mut input) {
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
        // A sample the container places (partly) past the end of the file: its data is not there.
        let end = u64::try_from(packet.position())
            .ok()
            .map(|pos| pos.saturating_add(packet.size() as u64));
        if let (Some(end), Some(len)) = (end, file_len) {
            if end > len {
                truncated = true;
                irregular.get_or_insert_with(|| "packet data past the end of the file".into());
            }
        }
        // Bytes that were lost and read back as zeros (a file whose tail was never written: a crash, a
        // preallocated download); no codec's packet is all zeros, and they decode to nothing.
        if packet
            .data()
            .is_some_and(|d| !d.is_empty() && d.iter().all(|&b| b == 0))
        {
            truncated = true;
            irregular.get_or_insert_with(|| "packet data all zero bytes".into());
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
        // A stream cut mid-GOP (a recording, a segment): what comes before its first keyframe decodes
        // only in part, or not at all, and the decoder may drop packets without a word (HEVC slices
        // whose parameter sets came earlier), which a packet table would count as frames.
        // An H.264 recovery point of intra refresh is marked a keyframe by its container, though
        // decoding cannot start there (nor does FFmpeg call its frame one): not one here either.
        let key = packet.is_key()
            && !(h264 && packet.data().and_then(|d| h264_key_picture(d, nal_len)) == Some(false));
        if packets.is_empty() && !key {
            irregular.get_or_insert_with(|| "the stream starts before its first keyframe".into());
        }
        // A decoder that reorders nothing outputs frames in packet order: pts going back in packet order
        // then reach the output as they are, where a table sorted by pts would number them otherwise.
        if reorder_delay == 0
            && packet.pts().is_some()
            && packets.last().and_then(|p| p.0) > packet.pts()
        {
            irregular.get_or_insert_with(|| {
                "pts out of packet order in a stream whose decoder does not reorder".into()
            });
        }
        if irregular.is_none() {
            start.feed(&packet);
        }
        packets.push((packet.pts(), packet.duration(), key));
    }
    drop(input);

    let mut frames_in: Vec<ScannedFrame> = Vec::new();
    let mut size = None;
    if irregular.is_none() {
        let mut sorted: Vec<(i64, i64, bool)> = packets
            .iter()
            .map(|&(pts, dur, key)| (pts.unwrap_or(i64::MIN), dur, key))
            .collect();
        sorted.sort_by_key(|p| p.0);
        if sorted.windows(2).any(|w| w[0].0 == w[1].0) {
            irregular = Some("duplicate pts".into());
        } else if let Some(reason) = start.finish(sorted.first().map(|p| p.0)) {
            irregular = Some(reason);
        }
        size = start.first.map(|f| (f.width, f.height));
        frames_in = sorted
            .into_iter()
            .map(|(pts, duration, key)| ScannedFrame {
                pts: Some(pts),
                duration,
                key,
            })
            .collect();
    }
    let mut damaged = false;
    // Frames the packet scan found: more than the decoder gives from a damaged file, whose frames past
    // the decodable end are then lost (DATA_LOSS), not out of range.
    let packet_frames = frames_in.len() as u64;
    let method = if let Some(reason) = &irregular {
        tracing::debug!(path = %pstr, %reason, "packet scan irregular; indexing by decoding");
        let scan = scan_by_decoding(file, st_index).map_err(|e| IndexError::Corrupt {
            path: pstr.clone(),
            reason: e.to_string(),
        })?;
        frames_in = scan.frames;
        damaged = scan.damaged;
        size = scan.size;
        IndexMethod::DecodeScan
    } else {
        IndexMethod::PacketScan
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
    let declared = if damaged {
        (facts.nb_frames.max(0) as u64).max(packet_frames)
    } else {
        facts.nb_frames.max(0) as u64
    };
    let declared_frames = if (truncated || damaged) && declared > frames.len() as u64 {
        declared
    } else {
        0
    };
    // The first decoded frame's size: the CLI outputs every frame at it (a container may declare
    // another, and streams may change size later).
    let (width, height) = size.unwrap_or((facts.width, facts.height));
    let h264_nal_length = if facts.codec == "h264" { nal_len } else { None };
    Ok(VideoIndex {
        damaged,
        h264_nal_length,
        stream: st_index,
        codec: facts.codec,
        pixel_format: facts.pixel_format,
        width,
        height,
        rotation: facts.rotation,
        mirror: facts.mirror,
        time_base: facts.time_base,
        avg_fps: facts.avg_fps,
        frames: frames.into(),
        keyframes: keyframes.into(),
        declared_frames,
        seek,
        method,
    })
}
