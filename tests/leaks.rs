//! Memory that must not grow with the work done: indexing a video and decoding GOP runs again and again
//! keeps the process's resident memory flat. (Reusing one `ff::Packet` across `av_read_frame` calls used
//! to leak every packet's data: ~0.75 MB per index build of a 10 s clip, and every packet a decode read.)
//! These bound memory, not time: a leak of a packet per read grows RSS by hundreds of MB here.

mod common;

use std::sync::Arc;

use vserve::decode::ffmpeg::FfmpegBackend;
use vserve::decode::{Backend, Geometry, GopRun, VideoSource};

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kb / 1024.0
}

#[test]
fn indexing_and_decoding_repeatedly_keep_memory_flat() {
    let path = common::media_path("torchcodec/nasa_13013.mp4");
    let size = std::fs::metadata(&path).expect("media").len() as f64 / 1e6;
    // Warm-up: first-use allocations (codec tables, thread pools) are not leaks.
    let index = Arc::new(vserve::decode::ffmpeg::build_index(&path, None, false).expect("index"));
    let before = rss_mb();
    for _ in 0..150 {
        let again = vserve::decode::ffmpeg::build_index(&path, None, false).expect("index");
        assert_eq!(again.frame_count(), index.frame_count());
    }
    let grown = rss_mb() - before;
    // A leak of every packet would be 150 × the stream's size (about 150 × {size:.1} MB).
    assert!(
        grown < 20.0,
        "150 index builds of a {size:.1} MB file grew RSS by {grown:.1} MB"
    );

    let source = VideoSource {
        path: path.clone(),
        index: index.clone(),
        gulp: None,
        file: None,
    };
    let geometry = Geometry {
        scaled_width: index.width,
        scaled_height: index.height,
        rotation: 0,
        mirror: false,
        resized: false,
    };
    let mut backend = FfmpegBackend::new(1);
    // Runs that need a seek each time: the last keyframe's GOP, then the first's, alternately.
    let last_key = index.keyframes.last().expect("keyframes");
    let runs = [
        GopRun {
            keyframe: last_key,
            wanted: vec![index.frame_count() - 1],
        },
        GopRun {
            keyframe: 0,
            wanted: vec![index.keyframes.get(1).map_or(10, |k| k - 1)],
        },
    ];
    for run in &runs {
        backend
            .decode_run(&source, run, geometry, None)
            .expect("warm-up run");
    }
    let before = rss_mb();
    let mut frames = 0;
    for i in 0..100 {
        let out = backend
            .decode_run(&source, &runs[i % 2], geometry, None)
            .expect("run");
        frames += out.frames.len();
    }
    assert_eq!(frames, 100);
    let grown = rss_mb() - before;
    assert!(
        grown < 20.0,
        "100 GOP runs of {} grew RSS by {grown:.1} MB",
        path.display()
    );
}
