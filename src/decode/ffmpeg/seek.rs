//! Putting an open video's decoder just before a keyframe: a seek by pts checked against the keyframe's
//! packet, aimed earlier when a demuxer lands past it, or a read from the start of the file.

use ffmpeg_next as ff;

use super::{open_decoder, open_for_decoding, read_only_stream, OpenVideo};
use crate::index::{IndexMethod, SeekMode, VideoIndex};

/// Where a seek for a run's keyframe stands: the keyframe's pts, which of [`SEEK_MARGINS`] aimed it, and
/// whether the keyframe is found among decoded frames (`by_frame`) rather than among packets.
///
/// By packet: packets are dropped until the keyframe's (its pts), so nothing before it is decoded. By
/// frame, for tables built by decoding (whose packets lack pts, as MPEG-PS packets that share a PES
/// header do): every packet goes to the decoder, which starts at the first keyframe it gives, the run's
/// or an earlier one. After a seek such a demuxer's parser can put a keyframe's pts on another packet
/// (MPEG-2 in MPEG-PS: on the P picture after it), so a packet sync fed the decoder from a P picture
/// and the frames wanted never came.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sync {
    pub(super) target: i64,
    pub(super) attempt: usize,
    pub(super) by_frame: bool,
}

/// How many frame durations before the keyframe's pts each seek aims, before reading from the start.
/// Demuxers that seek by dts (the binary search of MPEG-PS and -TS) land, when aimed at a keyframe's
/// pts, on a later frame whose dts equals it; aiming earlier finds the keyframe.
const SEEK_MARGINS: [i64; 3] = [0, 16, 256];

/// Puts the decoder just before `keyframe`: a seek that `attempt` aims ([`SEEK_MARGINS`]) followed by
/// dropping packets until the keyframe's ([`Sync`]) for ByPts tables; reading from the start of the file
/// (a reopen, no packet dropped, as the CLI decodes) for FromStart ones, for keyframe 0 when the table's
/// first frame is no keyframe or comes from a decode (whatever comes before it is decoded as the CLI
/// decodes it), and when every seek missed.
pub(super) fn reposition(
    video: &mut OpenVideo,
    index: &VideoIndex,
    keyframe: usize,
    attempt: usize,
) -> Result<(), String> {
    video.decoder.flush();
    video.next_frame = None;
    video.sync = None;
    video.palette_due = true;
    let first_from_start = keyframe == 0
        && (index.method == IndexMethod::DecodeScan
            || index.frames.first().is_some_and(|f| !f.key));
    if index.seek == SeekMode::FromStart || first_from_start || attempt >= SEEK_MARGINS.len() {
        reopen(video, index)?;
        if index.seek == SeekMode::FromStart {
            video.next_frame = Some(0);
        }
        return Ok(());
    }
    let target = index.frames.at(keyframe).pts;
    let step = index.frames.at(keyframe).duration.max(1);
    let aim = target.saturating_sub(SEEK_MARGINS[attempt].saturating_mul(step));
    // SAFETY: `input` is a valid open AVFormatContext and `stream` one of its streams.
    let ret = unsafe {
        ff::ffi::avformat_seek_file(
            video.input.as_mut_ptr(),
            video.stream as i32,
            i64::MIN,
            aim,
            aim,
            0,
        )
    };
    if ret < 0 {
        // Some demuxers cannot seek backwards by pts; reading from the start always works.
        tracing::debug!(path = %video.path.display(), aim, ret, "seek failed; reopening");
        reopen(video, index)?;
    } else {
        video.sync = Some(Sync {
            target,
            attempt,
            by_frame: index.method == IndexMethod::DecodeScan,
        });
    }
    Ok(())
}

/// Reads the file from its start again, with a fresh decoder: a flushed one keeps state a fresh one has
/// not (an HEVC decoder its parameter sets, and so decodes the leading pictures of a stream cut mid-GOP
/// that a fresh one, as the CLI's, drops), and what comes before the first keyframe must decode as the
/// CLI decodes it.
fn reopen(video: &mut OpenVideo, index: &VideoIndex) -> Result<(), String> {
    video.input = open_for_decoding(&video.file, index).map_err(|e| e.to_string())?;
    read_only_stream(&mut video.input, video.stream);
    video.decoder = open_decoder(&video.input, video.stream, video.threads, video.hw.as_ref())?;
    video.announce = false;
    Ok(())
}
