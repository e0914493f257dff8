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
    use std::os::unix::fs::PermissionsExt;
    let shm = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shm.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
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
    let clips = get(
        &mut c,
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
    drop(s);
    let want = |how: &str, data: &[u8]| format!("{how} {:016x}", fnv(data));

    // Outside the daemon's group: inline, the same bytes, and a warning naming why.
    let (got_clips, got_stream) = reader(&d.addr, OTHER_ID, OTHER_ID);
    assert_eq!(got_clips, want("inline", &clips.data), "GetClips");
    assert_eq!(
        got_stream,
        want("inline", &batch.data),
        "the stream's batch"
    );
    let log = d.log_text();
    assert!(
        log.contains("neither this daemon's user nor in its group") && log.contains("uid 65533"),
        "{log}"
    );

    // In the daemon's group (as its primary group): shared memory, the same bytes.
    let (got_clips, got_stream) = reader(&d.addr, OTHER_ID, DAEMON_ID);
    assert_eq!(got_clips, want("shm", &clips.data), "GetClips");
    assert_eq!(got_stream, want("shm", &batch.data), "the stream's batch");
    // And root, which opens anything: shared memory.
    let b = get(&mut c, clips_request()).await;
    assert!(b.header.shm.is_some());
    assert_eq!(b.data, clips.data);
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
    use std::os::unix::fs::PermissionsExt;
    let shm = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shm.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let d = Daemon::start_with(&[
        "--shm-dir",
        shm.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ])
    .await;
    let mut c = d.client().await;
    let clips = get(
        &mut c,
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
    drop(s);
    let (got_clips, got_stream) = reader(&d.tcp_addr(), OTHER_ID, OTHER_ID);
    assert_eq!(got_clips, format!("shm {:016x}", fnv(&clips.data)));
    assert_eq!(got_stream, format!("shm {:016x}", fnv(&batch.data)));
}
