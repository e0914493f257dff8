//! The whole-video check behind `vserve check`: decode every frame of one stream, as
//! `ffmpeg -threads 1 -i F -fps_mode passthrough -f null -` does, and say where damage starts.
//!
//! Input: a checked file (read through its descriptor) and an optional stream index. Output: a [`VideoCheck`]: the frames the decoder output,
//! the first bad frame and the damaged ranges. Damage is anything the demuxer or decoder reports: a read
//! error (truncated file), a packet flagged corrupt, a packet the decoder rejects, a frame it flags
//! (concealment, `AV_FRAME_FLAG_CORRUPT`), or a stream that ends well before the duration its container
//! declares (a truncated Matroska file ends in a silent EOF). A packet-level error is charged to the next
//! frame to be output (frames already out are clean), which is where `ffmpeg -xerror` stops; so the first
//! bad frame is conservative: frames before it decoded without any error reported.

use ffmpeg_next as ff;

use super::open_decoder;
use super::scan::{frame_damaged, open_stream, read_packet};
use crate::dataset::CheckedFile;
use crate::index::IndexError;

/// What decoding a whole stream found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VideoCheck {
    /// Container stream index decoded.
    pub stream: usize,
    /// Frames the decoder output (damaged or not).
    pub frames: u64,
    /// The first frame not known good: frames `0..first_bad_frame` decoded with no error reported.
    /// None when nothing was reported.
    pub first_bad_frame: Option<u64>,
    /// Frame ranges `[start, end)` of output frames flagged damaged or output after a reported error
    /// point, merged and ascending.
    pub bad_ranges: Vec<(u64, u64)>,
    /// The first problem, in words (None when clean).
    pub reason: Option<String>,
}

impl VideoCheck {
    /// Frames a sampler may use: those before the first bad frame.
    pub fn decodable_frames(&self) -> u64 {
        self.first_bad_frame.unwrap_or(self.frames).min(self.frames)
    }

    fn problem(&mut self, at: u64, reason: impl FnOnce() -> String) {
        if self.first_bad_frame.is_none() {
            self.first_bad_frame = Some(at);
            self.reason = Some(reason());
        }
        if let Some(last) = self.bad_ranges.last_mut() {
            if at <= last.1 {
                last.1 = last.1.max(at + 1);
                return;
            }
        }
        self.bad_ranges.push((at, at + 1));
    }
}

/// Decodes `file`'s stream (`stream` = container index, else FFmpeg's best video stream) from start to
/// end with one decoder thread, reading the checked descriptor ([`open_input`]). Fails only when the
/// file cannot be opened or has no decodable video stream; damage inside is reported in the result.
pub fn check_video(file: &CheckedFile, stream: Option<usize>) -> Result<VideoCheck, IndexError> {
    // Opened as the index opens it, so a file cut short is corrupt media here too (it was "cannot
    // open", remembered as a file vserve cannot read: INVALID_ARGUMENT after a restart, where the
    // daemon itself says DATA_LOSS).
    let (mut input, index) = open_stream(file, stream)?;
    let mut decoder = open_decoder(&input, index, 1, None).map_err(|reason| IndexError::Open {
        path: file.path.display().to_string(),
        reason: format!("unsupported media: {reason}"),
    })?;
    let mut check = VideoCheck {
        stream: index,
        ..VideoCheck::default()
    };
    let mut frame = ff::frame::Video::empty();
    let mut packet = ff::Packet::empty();
    // The decoded span, in the stream's time base.
    let mut span: Option<(i64, i64)> = None;
    let mut drain = |decoder: &mut ff::decoder::Video, check: &mut VideoCheck| {
        while decoder.receive_frame(&mut frame).is_ok() {
            if let Some(pts) = frame.timestamp() {
                // SAFETY: `frame` holds a frame just returned by the decoder; a plain field.
                let end = pts.saturating_add(unsafe { (*frame.as_ptr()).pkt_duration }.max(0));
                span = Some(span.map_or((pts, end), |(a, b)| (a.min(pts), b.max(end))));
            }
            if frame_damaged(&frame) {
                let at = check.frames;
                check.problem(at, || format!("frame {at} decoded with errors (concealed)"));
            }
            check.frames += 1;
        }
    };
    loop {
        match read_packet(&mut packet, &mut input) {
            Ok(()) => {}
            Err(ff::Error::Eof) => break,
            Err(e) => {
                let at = check.frames;
                check.problem(at, || {
                    format!("read stopped at frame {at}: {e} (truncated?)")
                });
                break;
            }
        }
        if packet.stream() != index {
            continue;
        }
        if packet.flags().contains(ff::packet::Flags::CORRUPT) {
            let at = check.frames;
            check.problem(at, || format!("corrupt packet before frame {at}"));
        }
        if let Err(e) = decoder.send_packet(&packet) {
            let at = check.frames;
            check.problem(at, || {
                format!("decoder rejected a packet before frame {at}: {e}")
            });
        }
        drain(&mut decoder, &mut check);
    }
    let _ = decoder.send_eof();
    drain(&mut decoder, &mut check);
    if let (Some(declared), Some((first, end))) = (declared_seconds(&input, index), span) {
        let tb = input
            .stream(index)
            .map_or(0.0, |st| f64::from(st.time_base()));
        let decoded = (end - first) as f64 * tb;
        if decoded + (declared * 0.1).max(1.0) < declared {
            let at = check.frames;
            check.problem(at, || {
                format!("the stream ends at {decoded:.2} s of the {declared:.2} s its container declares (truncated?)")
            });
        }
    }
    // Points charged to "the next frame" past the last one name no frame.
    for r in &mut check.bad_ranges {
        r.1 = r.1.min(check.frames);
    }
    check.bad_ranges.retain(|r| r.0 < r.1);
    Ok(check)
}

/// The stream's duration as its container declares it (the stream's own, else the file's), in seconds.
fn declared_seconds(input: &ff::format::context::Input, index: usize) -> Option<f64> {
    let st = input.stream(index)?;
    let own = st.duration();
    if own > 0 && own != ff::ffi::AV_NOPTS_VALUE {
        return Some(own as f64 * f64::from(st.time_base()));
    }
    let file = input.duration();
    (file > 0 && file != ff::ffi::AV_NOPTS_VALUE)
        .then(|| file as f64 / f64::from(ff::ffi::AV_TIME_BASE))
}
