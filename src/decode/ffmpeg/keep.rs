//! What a backend keeps open between runs, bounded by estimated bytes as well as by count.

use super::convert::Converter;
use super::{OpenVideo, OPEN_VIDEOS};

/// Estimated bytes ([`open_bytes`]) the videos a backend keeps open may hold: one 4K video's decoder
/// fits, an 8K one is closed after its run. Bounded by count alone, a thread kept four 8192x8192 videos'
/// decoders (2.3 GB for one with 16 references) after requests that asked for a few bytes.
pub(super) const OPEN_BYTES: usize = 320 << 20;
/// A converter whose buffers pass this is dropped after its run, not kept with its video: one request
/// resizing to 8192x8192 (cropped to 1x1) left 200 MB in each decode thread, outside every budget.
pub(super) const CONVERTER_BYTES: usize = 64 << 20;

/// An upper estimate of what an open video holds: its decoder's picture pool as a spare's is estimated
/// ([`DecoderKey::bytes`]'s rule: 20 pictures of 1.5 bytes a padded pixel) and its converter's buffers.
pub(super) fn open_bytes(video: &OpenVideo) -> usize {
    let (w, h) = (
        video.index.width.max(16) as usize + 64,
        video.index.height.max(16) as usize + 64,
    );
    w * h * 3 / 2 * 20 + video.converter.as_ref().map_or(0, Converter::bytes)
}

/// How many of the least recent of `estimates` (most recent first) to close so that at most
/// [`OPEN_VIDEOS`] stay and their estimates sum to at most [`OPEN_BYTES`] (the most recent included).
pub(super) fn to_close(estimates: &[usize]) -> usize {
    let mut kept = 0;
    let mut sum = 0;
    for &e in estimates {
        if kept == OPEN_VIDEOS || sum + e > OPEN_BYTES {
            break;
        }
        kept += 1;
        sum += e;
    }
    estimates.len() - kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_videos_are_bounded_by_count_and_by_bytes() {
        const MB: usize = 1 << 20;
        // Small videos: the count bounds them.
        assert_eq!(to_close(&[10 * MB; 3]), 0);
        assert_eq!(to_close(&[10 * MB; 6]), 6 - OPEN_VIDEOS);
        // A 4K video's decoder (about 270 MB) stays, with what fits beside it; the rest goes.
        assert_eq!(to_close(&[270 * MB, 10 * MB, 10 * MB]), 0);
        assert_eq!(to_close(&[270 * MB, 60 * MB, 10 * MB]), 2);
        // An 8K one (about 2 GB) is not kept at all, nor anything behind it.
        assert_eq!(to_close(&[2048 * MB, 10 * MB]), 2);
        const { assert!(OPEN_BYTES >= 270 * MB && CONVERTER_BYTES < 8192 * 8192 * 3) };
    }
}

#[cfg(test)]
mod idle_tests {
    use crate::decode::ffmpeg::FfmpegBackend;
    use crate::decode::{Backend, GopRun, VideoSource};
    use std::sync::Arc;

    /// An idle backend lets go of the videos it keeps open whose files were deleted (their space stays
    /// allocated while open), and keeps the others.
    #[test]
    fn an_idle_backend_lets_go_of_deleted_files() {
        let dir = tempfile::tempdir().unwrap();
        let demo = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/demo/nasa_13013.mp4"
        );
        let mut backend = FfmpegBackend::new(1);
        let mut source = |name: &str| {
            let path = dir.path().join(name);
            std::fs::copy(demo, &path).unwrap();
            let index = Arc::new(crate::decode::ffmpeg::build_index(&path, None, false).unwrap());
            let src = VideoSource {
                path,
                file: None,
                index,
                gulp: None,
            };
            let run = GopRun {
                keyframe: 0,
                wanted: vec![0],
            };
            let geometry = crate::decode::Geometry {
                scaled_width: src.index.width,
                scaled_height: src.index.height,
                rotation: 0,
                mirror: false,
                resized: false,
            };
            backend.decode_run(&src, &run, geometry, None).unwrap();
            src
        };
        let (kept, gone) = (source("kept.mp4"), source("gone.mp4"));
        assert_eq!(backend.open_count(), 2);
        backend.idle();
        assert_eq!(backend.open_count(), 2, "nothing deleted");
        std::fs::remove_file(&gone.path).unwrap();
        backend.idle();
        assert_eq!(backend.open_count(), 1, "the deleted file let go");
        assert!(kept.path.exists());
    }
}
