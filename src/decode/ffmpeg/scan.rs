//! Building a video's frame table with FFmpeg: one packet scan that checks every packet, or, when any
//! check fails, a full decode ([`scan_by_decoding`]). The table itself and its lookups are
//! [`crate::index`], which knows nothing of FFmpeg.

use std::path::Path;

use ff::codec::packet::Ref as _;
use ffmpeg_next as ff;

use super::h264::nal_units_tile;
use super::info::{init, pick_stream, stream_facts};
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

/// What a decode scan found.
pub struct DecodeScan {
    pub frames: Vec<ScannedFrame>,
    /// The decoder reported errors (rejected packets, concealed or corrupt frames).
    pub errors: bool,
}

/// True when the decoder flagged this frame as damaged (concealment active, or marked corrupt).
pub(super) fn frame_damaged(frame: &ff::frame::Video) -> bool {
    // SAFETY: `frame` holds a frame just returned by the decoder; these are plain fields.
    unsafe {
        let f = &*frame.as_ptr();
        f.decode_error_flags != 0 || (f.flags & ff::ffi::AV_FRAME_FLAG_CORRUPT) != 0
    }
}

/// Indexes a stream by decoding all of it: the table of what the decoder really outputs. One decoder
/// thread, as every run decodes, so concealment of damaged data is the same.
pub fn scan_by_decoding(file: &CheckedFile, index: usize) -> Result<DecodeScan, DecodeError> {
    init();
    let path = file.path.as_path();
    let mut input = open_input(file, true, Stage::Index).map_err(|e| DecodeError::Open {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let mut decoder =
        open_decoder(&input, index, 1, None).map_err(|reason| DecodeError::Unsupported {
            path: path.to_owned(),
            reason,
        })?;
    let mut frames = Vec::new();
    let mut errors = false;
    let mut frame = ff::frame::Video::empty();
    let mut packet = ff::Packet::empty();
    let mut drain =
        |decoder: &mut ff::decoder::Video, frames: &mut Vec<ScannedFrame>, errors: &mut bool| {
            while decoder.receive_frame(&mut frame).is_ok() {
                *errors |= frame_damaged(&frame);
                // SAFETY: `frame` holds a frame just returned by the decoder.
                let duration = unsafe { (*frame.as_ptr()).pkt_duration };
                frames.push(ScannedFrame {
                    pts: frame.pts(),
                    duration,
                    key: frame.is_key(),
                });
            }
        };
    while read_packet(&mut packet, &mut input).is_ok() {
        if packet.stream() != index {
            continue;
        }
        if let Err(e) = decoder.send_packet(&packet) {
            errors = true;
            tracing::trace!(path = %path.display(), error = %e, "packet rejected during scan");
        }
        drain(&mut decoder, &mut frames, &mut errors);
    }
    let _ = decoder.send_eof();
    drain(&mut decoder, &mut frames, &mut errors);
    Ok(DecodeScan { frames, errors })
}

/// One frame as the decode scan saw it.
#[derive(Clone, Copy, Debug)]
pub struct ScannedFrame {
    pub pts: Option<i64>,
    pub duration: i64,
    pub key: bool,
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

/// Builds the index of `file`'s stream (`stream` = container index, or FFmpeg's best video stream).
/// `force_decode` skips the packet-scan table and indexes by decoding (for videos found damaged).
pub fn build_index_of(
    file: &CheckedFile,
    stream: Option<usize>,
    force_decode: bool,
) -> Result<VideoIndex, IndexError> {
    let pstr = file.path.display().to_string();
    init();
    let mut input = open_input(file, true, Stage::Index).map_err(|e| IndexError::Open {
        path: pstr.clone(),
        reason: e.to_string(),
    })?;
    let st_index = pick_stream(&input, stream).map_err(|detail| IndexError::NoVideo {
        path: pstr.clone(),
        detail,
    })?;
    let facts = stream_facts(&input, st_index).map_err(|reason| IndexError::Corrupt {
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
        let scan = scan_by_decoding(file, st_index).map_err(|e| IndexError::Corrupt {
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
