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

    /// `path` with its frame table, as the fleet hands a video to a backend.
    fn indexed(path: std::path::PathBuf) -> VideoSource {
        let index = Arc::new(crate::decode::ffmpeg::build_index(&path, None, false).unwrap());
        VideoSource {
            path,
            file: None,
            index,
            gulp: None,
        }
    }

    /// Output frames of `width`x`height`, unrotated; `resized` when that size was asked for.
    fn sized(width: u32, height: u32, resized: bool) -> crate::decode::Geometry {
        crate::decode::Geometry {
            scaled_width: width,
            scaled_height: height,
            rotation: 0,
            mirror: false,
            resized,
        }
    }

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
            let src = indexed(path);
            let run = GopRun {
                keyframe: 0,
                wanted: vec![0],
            };
            let geometry = sized(src.index.width, src.index.height, false);
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

    /// A video too large to keep open after its run (a 4096x4096 decoder, about 500 MB by
    /// [`super::open_bytes`]) stays open while its run is sliced: each slice goes on where the last
    /// stopped. It was closed at every slice's end and decoded again from the keyframe, so five frames
    /// of one GOP cost 15 decodes, and a 30-frame 8K clip ran past the decode deadline (probe D).
    #[test]
    fn a_video_too_large_to_keep_stays_open_while_its_run_is_sliced() {
        const { assert!(4160 * 4160 * 3 / 2 * 20 > super::OPEN_BYTES) };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.mp4");
        let args = "-v error -f lavfi -i testsrc=s=4096x4096:r=10 -frames:v 5 -c:v libx264 -preset ultrafast -g 100";
        let encoded = std::process::Command::new("ffmpeg")
            .args(args.split(' '))
            .arg(&path)
            .status()
            .unwrap();
        assert!(encoded.success());
        let src = indexed(path);
        let run = GopRun {
            keyframe: 0,
            wanted: (0..5).collect(),
        };
        let geometry = sized(64, 64, true);
        let whole = FfmpegBackend::new(1)
            .decode_run(&src, &run, geometry, None)
            .unwrap();
        assert_eq!((whole.decoded, whole.frames.len()), (5, 5));

        let mut backend = FfmpegBackend::new(1);
        let mut rest = run.clone();
        let (mut frames, mut decoded, mut slices) = (Vec::new(), 0, 0);
        while !rest.wanted.is_empty() {
            let out = backend
                .decode_one_slice(&src, &rest, geometry, slices == 0)
                .unwrap();
            slices += 1;
            decoded += out.decoded;
            rest.wanted
                .retain(|k| !out.frames.iter().any(|(g, _)| g == k));
            frames.extend(out.frames);
        }
        assert!(slices >= 3, "{slices} slices");
        assert_eq!(decoded, 5, "each frame decoded once over {slices} slices");
        assert_eq!(frames.len(), 5);
        for ((k, f), (wk, w)) in frames.iter().zip(&whole.frames) {
            assert!(k == wk && f.data == w.data, "frame {k} differs");
        }
        assert_eq!(backend.open_count(), 0, "closed once its run ended");
    }
}
