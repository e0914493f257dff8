//! GulpIO datasets, against GulpIO's reference implementation (gulpio2 from PyPI, in its own virtualenv
//! made by tests/gulp_venv.sh; driven by tests/gulp_ref.py):
//! - a dataset gulpio2 wrote is served (Probe, GetClips, StreamBatches, ListDatasets) with the frames
//!   gulpio2 reads back, up to ±1 per channel (both decode the same JPEG bytes with libjpeg-turbo's fast
//!   IDCT and fast upsampling; the two builds' SIMD paths may round differently);
//! - a dataset `vserve ingest` wrote is read by gulpio2 with the same ids, metadata and frames (±1), and
//!   those frames are the daemon's own decode of the source frames, up to JPEG loss;
//! - an ingest SIGKILLed halfway and rerun leaves a complete dataset: gulp-check passes, every id once;
//! - a truncated .gulp, a broken .gmeta and a bad JPEG record give DATA_LOSS for their videos only, and
//!   gulp-check reports each;
//! - a .gulp truncated in place while served fails only the frames it lost (it took the daemon down with
//!   SIGBUS when chunks were memory-mapped), and one renamed over fails its videos by name.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use vserve_client::Client;

/// The reference implementation's interpreter (made once per test binary).
fn python() -> &'static str {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gulp_venv.sh"))
            .output()
            .expect("run tests/gulp_venv.sh");
        assert!(
            out.status.success(),
            "gulp_venv.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
}

fn gulp_ref(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gulp_ref.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .expect("run gulp_ref.py");
    assert!(
        out.status.success(),
        "gulp_ref.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What gulpio2 read: per id (sorted), its frames [T,H,W,3] and meta data.
struct RefVideo {
    id: String,
    meta: serde_json::Value,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn gulpio2_read(dir: &Path) -> Vec<RefVideo> {
    let dump = tempfile::tempdir().unwrap();
    gulp_ref(&["read", dir.to_str().unwrap(), dump.path().to_str().unwrap()]);
    let index: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dump.path().join("index.json")).unwrap())
            .unwrap();
    index
        .into_iter()
        .map(|v| {
            let bytes = std::fs::read(dump.path().join(v["npy"].as_str().unwrap())).unwrap();
            let (descr, fortran, shape, data) = read_npy(&bytes);
            assert_eq!(descr, "|u1");
            assert!(!fortran);
            RefVideo {
                id: v["id"].as_str().unwrap().to_owned(),
                meta: v["meta"].clone(),
                shape,
                data: data.to_vec(),
            }
        })
        .collect()
}

fn vserve(args: &[&str]) -> std::process::Output {
    Command::new(vserve_bin()).args(args).output().unwrap()
}

fn gulp_check(dir: &Path) -> (bool, String) {
    let out = vserve(&["gulp-check", dir.to_str().unwrap()]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Every frame of `id` as the daemon serves it (native size, uint8 THWC).
async fn all_frames(c: &mut Client, dataset: &str, id: &str, t: usize) -> (Vec<u8>, usize, usize) {
    let p = probe(c, probe_req(dataset, id, None, false)).await;
    assert_eq!(p.frame_count as usize, t, "{id}: frame count");
    let frames: Vec<u64> = (0..t as u64).collect();
    let b = get(
        c,
        clips_req(dataset, vec![frames_clip(id, &frames, None)], None),
    )
    .await;
    let (h, w) = (p.display_height as usize, p.display_width as usize);
    u8_frames(&b, t, h, w);
    (b.data, h, w)
}

fn media(rel: &str) -> String {
    media_path(rel).display().to_string()
}

#[test]
fn reference_dataset_is_served_with_gulpio2s_frames() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ref");
    let root_s = root.to_str().unwrap();
    // Two chunks; an id with a slash; a rotated source (ffmpeg's autorotated frames are what is stored).
    gulp_ref(&[
        "write",
        root_s,
        "2",
        &format!("clips/test.mp4={}:cat", media("gulpio/test.mp4")),
        &format!("short={}:dog", media("imageio/realshort.mp4")),
        &format!("rot90={}:cat", media("decord/video_90.mov")),
    ]);
    assert!(gulp_check(&root).0, "{}", gulp_check(&root).1);
    let reference = gulpio2_read(&root);
    assert_eq!(
        reference.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["clips/test.mp4", "rot90", "short"]
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let d = rt.block_on(Daemon::start_with(&["--dataset", &format!("g={root_s}")]));
    rt.block_on(async {
        let mut c = d.client().await;
        let listed = c.list_datasets().await.unwrap();
        let g = listed
            .datasets
            .iter()
            .find(|x| x.name == "g")
            .expect("dataset g");
        assert_eq!(g.video_count, 3);
        for r in &reference {
            let (data, h, w) = all_frames(&mut c, "g", &r.id, r.shape[0]).await;
            assert_eq!([h, w], [r.shape[1], r.shape[2]], "{}: frame size", r.id);
            let what = format!("{}: vserve vs gulpio2", r.id);
            assert_close(&data, &r.data, 1, Some((w, h)), &what);
            let st = diff_stats(&data, &r.data);
            eprintln!("{what}: {} bytes differ, max {}", st.count, st.max);
        }
        // Same transforms as video: a resized, cropped, flipped float request is the native frames
        // resized by the batch stage's bilinear resize, then cropped and flipped.
        let t = vserve_client::proto::Transform {
            resize: Some(vserve_client::proto::transform::Resize::Size(
                vserve_client::proto::Size {
                    width: 128,
                    height: 72,
                },
            )),
            ..Default::default()
        };
        let b = get(
            &mut c,
            clips_req(
                "g",
                vec![frames_clip("clips/test.mp4", &[0, 139], None)],
                Some(t),
            ),
        )
        .await;
        assert_eq!(b.header.shape, vec![1, 2, 72, 128, 3]);
        // Unknown ids are NOT_FOUND; frames past the end OUT_OF_RANGE.
        expect_code(
            c.probe(probe_req("g", "nope", None, false)).await,
            &["NOT_FOUND"],
            "unknown id",
        );
        expect_code(
            c.get_clips(clips_req(
                "g",
                vec![frames_clip("short", &[36], None)],
                None,
            ))
            .await,
            &["OUT_OF_RANGE"],
            "frame past the end",
        );
    });
    // StreamBatches samples the ids with the labels of their meta data.
    let out = vserve(&[
        "stream",
        "--addr",
        &d.addr,
        "--dataset",
        "g",
        "--frames-per-clip",
        "2",
        "--batch-size",
        "2",
        "--size",
        "32x32",
        "--list",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seen: Vec<(String, String)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["video"].as_str().unwrap().to_owned(),
                v["label"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("clips/test.mp4".to_owned(), "cat".to_owned()),
            ("rot90".to_owned(), "cat".to_owned()),
            ("short".to_owned(), "dog".to_owned())
        ]
    );
}

/// A dataset directory of real files and a manifest with labels and a trim.
fn ingest_source(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::copy(media_path("gulpio/test.mp4"), src.join("sub/test.mp4")).unwrap();
    std::fs::copy(media_path("gulpio/test.webm"), src.join("test.webm")).unwrap();
    std::fs::copy(media_path("decord/video_90.mov"), src.join("rot.mov")).unwrap();
    let manifest = src.join("train.csv");
    std::fs::write(
        &manifest,
        "path,label,start,end\nsub/test.mp4,3,1.0,2.5\ntest.webm,7,,\nrot.mov,3,,\n",
    )
    .unwrap();
    manifest
}

#[test]
fn ingested_dataset_reads_back_in_gulpio2() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = ingest_source(dir.path());
    let out = dir.path().join("gulp");
    let run = vserve(&[
        "ingest",
        "--dataset-dir",
        dir.path().join("src").to_str().unwrap(),
        "--manifest",
        manifest.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--fps",
        "10",
        "--short-side",
        "96",
        "--videos-per-chunk",
        "2",
        "--jobs",
        "2",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(String::from_utf8_lossy(&run.stderr).contains("3 videos stored"));
    let (ok, report) = gulp_check(&out);
    assert!(ok, "{report}");
    assert!(out.join("meta_1.gmeta").exists(), "two chunks");
    let labels: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("label2idx.json")).unwrap())
            .unwrap();
    assert_eq!(labels, serde_json::json!({"3": 3, "7": 7}));

    let reference = gulpio2_read(&out);
    let ids: Vec<&str> = reference.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["rot.mov", "sub/test.mp4", "test.webm"]);
    // test.mp4 (30 fps) trimmed to [1.0, 2.5) at 10 fps: 15 frames, 96 pixels high.
    let by_id = |id: &str| reference.iter().find(|r| r.id == id).unwrap();
    assert_eq!(by_id("sub/test.mp4").shape[0], 15);
    assert_eq!(by_id("sub/test.mp4").shape[1..], [96, 171, 3]);
    let m = &by_id("sub/test.mp4").meta;
    assert_eq!(m["path"], "sub/test.mp4");
    assert_eq!(m["label"], "3");
    assert_eq!(m["label_index"], 3);
    assert_eq!(m["start"], 1.0);
    assert_eq!(m["end"], 2.5);
    assert_eq!(m["fps"], 10.0);
    assert_eq!(m["frames"], 15);
    assert_eq!(by_id("test.webm").meta["label"], "7");
    assert!(by_id("test.webm").meta.get("start").is_none());

    let rt = tokio::runtime::Runtime::new().unwrap();
    let d = rt.block_on(Daemon::start_with(&[
        "--dataset",
        &format!("g={}", out.display()),
        "--dataset",
        &format!("src={}", dir.path().join("src").display()),
    ]));
    rt.block_on(async {
        let mut c = d.client().await;
        for r in &reference {
            let (data, h, w) = all_frames(&mut c, "g", &r.id, r.shape[0]).await;
            assert_eq!([h, w], [r.shape[1], r.shape[2]]);
            assert_close(
                &data,
                &r.data,
                1,
                Some((w, h)),
                &format!("{}: vserve vs gulpio2", r.id),
            );
        }
        // Stored frames are the daemon's decode of the source frames, up to JPEG loss: test.mp4 at 30 fps
        // from 1.0 s every 0.1 s is source frames 30, 33, ..., 72, served at the same short side.
        let source: Vec<u64> = (0..15).map(|j| 30 + 3 * j).collect();
        let t = vserve_client::proto::Transform {
            resize: Some(vserve_client::proto::transform::Resize::ShortSide(96)),
            ..Default::default()
        };
        let raw = get(
            &mut c,
            clips_req(
                "src",
                vec![frames_clip("sub/test.mp4", &source, None)],
                Some(t),
            ),
        )
        .await;
        let stored = &by_id("sub/test.mp4").data;
        assert_eq!(raw.data.len(), stored.len());
        let st = diff_stats(&raw.data, stored);
        let mean = raw
            .data
            .iter()
            .zip(stored)
            .map(|(a, b)| (*a as i32 - *b as i32).unsigned_abs() as u64)
            .sum::<u64>() as f64
            / stored.len() as f64;
        eprintln!(
            "source vs stored (JPEG q90): {} bytes differ, max {}, mean abs {mean:.3}",
            st.count, st.max
        );
        assert!(
            mean < 2.0,
            "stored frames differ from the source frames by {mean} on average"
        );
    });
}

#[test]
fn ingest_killed_halfway_then_rerun_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let n = 10;
    for i in 0..n {
        std::fs::copy(
            media_path("moviepy/chaplin.mp4"),
            src.join(format!("v{i:02}.mp4")),
        )
        .unwrap();
    }
    let out = dir.path().join("gulp");
    let args = |quiet: bool| {
        let mut a = vec![
            "ingest".to_owned(),
            "--dataset-dir".into(),
            src.display().to_string(),
            "--out".into(),
            out.display().to_string(),
            "--videos-per-chunk".into(),
            "2".into(),
            "--jobs".into(),
            "1".into(),
        ];
        if quiet {
            a.push("--quiet".into());
        }
        a
    };
    let mut child = Command::new(vserve_bin())
        .args(args(true))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once the first chunk is complete and the second is being written.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if out.join("meta_0.gmeta").exists() && out.join(".data_1.gulp.tmp").exists() {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "ingest finished before it could be killed"
        );
        assert!(Instant::now() < deadline, "ingest made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // What a reader sees now is complete chunks only; the interrupted chunk is a temporary file.
    let (_, report) = gulp_check(&out);
    assert!(!report.contains("problem:"), "{report}");
    assert!(report.contains("temporary file"), "{report}");

    let rerun = vserve(&args(false).iter().map(|s| s.as_str()).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&rerun.stderr);
    assert!(rerun.status.success(), "{stderr}");
    assert!(
        !stderr.contains(" 0 already present"),
        "the rerun skipped nothing: {stderr}"
    );
    let (ok, report) = gulp_check(&out);
    assert!(ok, "{report}");
    assert!(!report.contains("warning"), "{report}");
    // Every id exactly once (gulpio2 itself asserts that ids are unique across chunks).
    let mut ids = Vec::new();
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".gmeta") {
            let v: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
            ids.extend(v.keys().cloned());
        }
    }
    ids.sort();
    let expected: Vec<String> = (0..n).map(|i| format!("v{i:02}.mp4")).collect();
    assert_eq!(ids, expected);
    // gulpio2 reads every video whole (chaplin.mp4 has 241 frames).
    let counts: serde_json::Value =
        serde_json::from_str(&gulp_ref(&["ids", out.to_str().unwrap()])).unwrap();
    let expected_counts: serde_json::Map<String, serde_json::Value> =
        expected.iter().map(|id| (id.clone(), 241.into())).collect();
    assert_eq!(counts, serde_json::Value::Object(expected_counts));
}

/// `n` copies of gulpio/test.mp4 ingested at 5 fps, one video per chunk (chunk k holds video k: one
/// job, in order): (the temporary directory, the gulp directory inside it).
fn ingest_one_per_chunk(n: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..n {
        std::fs::copy(
            media_path("gulpio/test.mp4"),
            src.join(format!("{}.mp4", (b'a' + i as u8) as char)),
        )
        .unwrap();
    }
    let out = dir.path().join("gulp");
    let run = vserve(&[
        "ingest",
        "--dataset-dir",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--videos-per-chunk",
        "1",
        "--jobs",
        "1",
        "--fps",
        "5",
        "--quiet",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    (dir, out)
}

/// Chunk `k`'s meta file, parsed.
fn chunk_meta(out: &Path, k: u64) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join(format!("meta_{k}.gmeta"))).unwrap())
        .unwrap()
}

#[test]
fn corrupt_chunks_are_data_loss_for_their_videos_only() {
    let (_dir, out) = ingest_one_per_chunk(4);
    let meta = |k: u64| chunk_meta(&out, k);
    let id_of = |k: u64| meta(k).as_object().unwrap().keys().next().unwrap().clone();
    let (truncated, broken, bad_jpeg, intact) = (id_of(0), id_of(1), id_of(2), id_of(3));
    // Truncated .gulp: cut chunk 0's data file in half.
    let d0 = out.join("data_0.gulp");
    let len = std::fs::metadata(&d0).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&d0)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    // Broken .gmeta: chunk 1's meta cut mid-JSON.
    let m1 = std::fs::read_to_string(out.join("meta_1.gmeta")).unwrap();
    std::fs::write(out.join("meta_1.gmeta"), &m1[..m1.len() / 2]).unwrap();
    // Bad JPEG: frames 0 and 3 of chunk 2's video have their headers zeroed (a bad frame 0 once made
    // the whole video unreadable: its size was read from it).
    let mut d2 = std::fs::read(out.join("data_2.gulp")).unwrap();
    for k in [0, 3] {
        let f = meta(2)[&bad_jpeg]["frame_info"][k].clone();
        let off = f[0].as_u64().unwrap() as usize;
        d2[off..off + 16].fill(0);
    }
    std::fs::write(out.join("data_2.gulp"), d2).unwrap();

    let (ok, report) = gulp_check(&out);
    assert!(!ok, "{report}");
    assert!(report.contains("data_0.gulp"), "{report}");
    assert!(
        report.contains("meta_1.gmeta: not a valid meta file"),
        "{report}"
    );
    assert!(
        report.contains(&format!("video {bad_jpeg:?} frame 3: not a valid JPEG")),
        "{report}"
    );
    assert!(!report.contains(&format!("{intact:?}")), "{report}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut d = rt.block_on(Daemon::start_with(&[
        "--dataset",
        &format!("g={}", out.display()),
    ]));
    rt.block_on(async {
        let mut c = d.client().await;
        let clip =
            |id: &str, frames: &[u64]| clips_req("g", vec![frames_clip(id, frames, None)], None);
        expect_code(
            c.get_clips(clip(&truncated, &[0])).await,
            &["DATA_LOSS"],
            "truncated chunk",
        );
        expect_code(
            c.probe(probe_req("g", &truncated, None, false)).await,
            &["DATA_LOSS"],
            "truncated chunk probe",
        );
        // The broken meta file's ids are unknown; the daemon says a chunk is unreadable.
        expect_code(
            c.get_clips(clip(&broken, &[0])).await,
            &["DATA_LOSS"],
            "broken meta",
        );
        expect_code(
            c.get_clips(clip(&bad_jpeg, &[2, 3])).await,
            &["DATA_LOSS"],
            "bad JPEG",
        );
        expect_code(
            c.get_clips(clip(&bad_jpeg, &[0])).await,
            &["DATA_LOSS"],
            "bad JPEG at frame 0",
        );
        // The same video's good frames, and the intact chunk, are served.
        let p = probe(&mut c, probe_req("g", &bad_jpeg, None, false)).await;
        assert!(p.width > 0 && p.height > 0);
        get(&mut c, clip(&bad_jpeg, &[1, 2, 4])).await;
        let (data, _, _) = all_frames(&mut c, "g", &intact, 24).await;
        assert!(!data.is_empty());
        let err = c.get_clips(clip(&bad_jpeg, &[3])).await.unwrap_err();
        assert!(err.to_string().contains("frame"), "{err}");
    });
    assert!(d.is_running());
}

/// `cp` or `rsync --inplace` over a served chunk truncates it in place. Read through a memory map, the
/// next read past the new end faulted (SIGBUS) and the daemon died with every tenant's calls; read with
/// `pread`, only the frames that are gone fail, DATA_LOSS naming the truncation, and the frames still
/// there keep their pixels. A chunk renamed over is no longer what the start-up meta data describes: its
/// videos are DATA_LOSS, named so.
#[test]
fn a_chunk_truncated_while_served_fails_only_the_frames_it_lost() {
    let (_dir, out) = ingest_one_per_chunk(3);
    let meta = |k: u64| chunk_meta(&out, k);
    let id_of = |k: u64| meta(k).as_object().unwrap().keys().next().unwrap().clone();
    let (cut_id, replaced, other) = (id_of(0), id_of(1), id_of(2));
    let records = meta(0)[&cut_id]["frame_info"].as_array().unwrap().clone();
    let t = records.len();
    assert!(t >= 8, "{t} frames");
    // Cut the data file at the start of frame t/2: frames before it stay whole.
    let keep = t / 2;
    let cut_at = records[keep][0].as_u64().unwrap();
    let (cut_id, replaced, other) = (cut_id.as_str(), replaced.as_str(), other.as_str());

    let rt = tokio::runtime::Runtime::new().unwrap();
    // No cache: every request below reads the chunk again.
    let mut d = rt.block_on(Daemon::start_with(&[
        "--dataset",
        &format!("g={}", out.display()),
        "--cache-bytes",
        "0",
    ]));
    rt.block_on(async {
        let mut c = d.client().await;
        let (before, h, w) = all_frames(&mut c, "g", cut_id, t).await;
        let (other_before, _, _) = all_frames(&mut c, "g", other, t).await;
        all_frames(&mut c, "g", replaced, t).await;
        let frame_bytes = h * w * 3;

        std::fs::OpenOptions::new()
            .write(true)
            .open(out.join("data_0.gulp"))
            .unwrap()
            .set_len(cut_at)
            .unwrap();
        let copy = out.join("data_1.gulp.new");
        std::fs::copy(out.join("data_1.gulp"), &copy).unwrap();
        std::fs::rename(&copy, out.join("data_1.gulp")).unwrap();

        for k in keep..t {
            let err = c
                .get_clips(clips_req(
                    "g",
                    vec![frames_clip(cut_id, &[k as u64], None)],
                    None,
                ))
                .await
                .unwrap_err();
            assert_eq!(err.code_name(), "DATA_LOSS", "frame {k}: {err}");
            assert!(
                err.to_string().contains("truncated while served"),
                "frame {k}: {err}"
            );
        }
        let kept: Vec<u64> = (0..keep as u64).collect();
        let b = get(
            &mut c,
            clips_req("g", vec![frames_clip(cut_id, &kept, None)], None),
        )
        .await;
        assert!(
            b.data == before[..keep * frame_bytes],
            "the frames before the cut changed"
        );
        let (other_after, _, _) = all_frames(&mut c, "g", other, t).await;
        assert!(
            other_after == other_before,
            "the other chunk's frames changed"
        );
        let err = c
            .get_clips(clips_req(
                "g",
                vec![frames_clip(replaced, &[0], None)],
                None,
            ))
            .await
            .unwrap_err();
        assert_eq!(err.code_name(), "DATA_LOSS", "{err}");
        assert!(err.to_string().contains("replaced while served"), "{err}");
    });
    assert!(d.is_running(), "the daemon died");
}

#[test]
fn ingest_reports_failures_and_a_rerun_retries_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(media_path("gulpio/test.mp4"), src.join("good.mp4")).unwrap();
    std::fs::write(src.join("bad.mp4"), "not a video\n".repeat(100)).unwrap();
    let out = dir.path().join("gulp");
    let args = [
        "ingest",
        "--dataset-dir",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--fps",
        "2",
    ];
    let first = vserve(&args);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 videos stored"), "{stderr}");
    assert!(stderr.contains("failed: \"bad.mp4\""), "{stderr}");
    assert!(stderr.contains("ingest ["), "progress line: {stderr}");
    assert!(gulp_check(&out).0);
    std::fs::copy(media_path("imageio/realshort.mp4"), src.join("bad.mp4")).unwrap();
    let second = vserve(&args);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert!(
        stderr.contains("1 videos stored") && stderr.contains("1 already present"),
        "{stderr}"
    );
    let counts: serde_json::Value =
        serde_json::from_str(&gulp_ref(&["ids", out.to_str().unwrap()])).unwrap();
    assert_eq!(counts, serde_json::json!({"bad.mp4": 3, "good.mp4": 10}));
}

/// Ingest opens a manifest's paths as the daemon does: beneath the dataset directory, never through a
/// symlink out of it (it stored, and the daemon then served, the frames of a file outside). It refuses
/// an `--fps` outside what a gulp dataset may store (`1e9` grew its memory by 300 MB/s; 20000 was written
/// and then read back as 25) and an `--out` that is the dataset directory (chunks beside the videos make
/// it a gulp dataset whose videos are no longer served).
#[test]
fn ingest_stays_inside_its_dataset_and_refuses_what_it_cannot_store() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::copy(media_path("gulpio/test.mp4"), src.join("good.mp4")).unwrap();
    std::fs::copy(
        media_path("imageio/realshort.mp4"),
        outside.join("secret.mp4"),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.join("secret.mp4"), src.join("link.mp4")).unwrap();
    std::os::unix::fs::symlink(&outside, src.join("linkdir")).unwrap();
    let manifest = dir.path().join("m.csv");
    std::fs::write(&manifest, "path\ngood.mp4\nlink.mp4\nlinkdir/secret.mp4\n").unwrap();
    let out = dir.path().join("gulp");
    let ingest = |extra: &[&str]| {
        let mut args = vec![
            "ingest",
            "--dataset-dir",
            src.to_str().unwrap(),
            "--manifest",
            manifest.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--fps",
            "2",
        ];
        args.extend_from_slice(extra);
        vserve(&args)
    };
    let run = ingest(&[]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 videos stored"), "{stderr}");
    for name in ["link.mp4", "linkdir/secret.mp4"] {
        assert!(
            stderr.contains(&format!("failed: \"{name}\"")) && stderr.contains("leaves dataset"),
            "{name}: {stderr}"
        );
    }
    let counts: serde_json::Value =
        serde_json::from_str(&gulp_ref(&["ids", out.to_str().unwrap()])).unwrap();
    assert_eq!(counts, serde_json::json!({"good.mp4": 10}));

    for fps in ["1e9", "20000", "0.0001"] {
        let other = dir.path().join(format!("fps-{fps}"));
        let run = vserve(&[
            "ingest",
            "--dataset-dir",
            src.to_str().unwrap(),
            "--out",
            other.to_str().unwrap(),
            "--fps",
            fps,
        ]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(64), "--fps {fps}: {stderr}");
        assert!(
            stderr.contains("is outside 0.001..=10000"),
            "--fps {fps}: {stderr}"
        );
    }
    let run = vserve(&[
        "ingest",
        "--dataset-dir",
        src.to_str().unwrap(),
        "--out",
        src.join(".").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("is the dataset directory itself"),
        "{stderr}"
    );
    assert!(
        !crate_is_gulp_dir(&src),
        "chunks were written beside the videos"
    );
}

fn crate_is_gulp_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        n.ends_with(".gulp") || n.ends_with(".gmeta")
    })
}
