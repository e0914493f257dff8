//! Streams against the in-flight budget and the sampler's size limits.

use super::*;

/// Waits (at most 10 s) until the engine's budget holds nothing: streams give theirs back as they end.
async fn all_given_back(e: &Arc<Engine>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while e.budget().in_use() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} bytes still held",
            e.budget().in_use()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_hold_their_window_and_are_refused_past_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    // Batches of 1 clip of 2 frames of 8x4: 192 bytes out, 192 bytes of decoded frames. A window:
    // (prefetch 2 + 3) × 192 outputs, reserved at the start, + 2 × 192 frames, at the first batch.
    let limits = Limits {
        max_inflight_bytes: 3_000,
        ..Limits::default()
    };
    let e = engine_with(dir.path(), limits);
    let mut one = start(&e, request("demo", 1), Peer::local()).await.unwrap();
    assert_eq!(one.recv().await.unwrap().unwrap().data.len(), 192);
    // Its window, and its sample order: 4 bytes for each of the 3 samples (outside any budget, a
    // million-sample shard held 10.6 MB a stream: probe E).
    assert_eq!(e.budget().in_use(), 1344 + 12);
    // A second such stream fits (2712 of 3000); a third does not: refused at its start, by name, after
    // the budget's wait (windows do not shrink while their streams run).
    let mut two = start(&e, request("demo", 1), Peer::local()).await.unwrap();
    assert_eq!(two.recv().await.unwrap().unwrap().data.len(), 192);
    let t = std::time::Instant::now();
    match start(&e, request("demo", 1), Peer::local()).await {
        Err(Error::Overloaded(m)) => assert_eq!(
            m,
            "StreamBatches of \"demo\" (5 batches of 192 bytes: prefetch 2 + 3) needs 960 bytes (960 B), 2712 of 3000 in use (max-inflight-bytes)"
        ),
        other => panic!("expected RESOURCE_EXHAUSTED, got {:?}", other.map(|_| ())),
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    // The admitted streams go on to their end, within their windows.
    let mut rest = 0;
    for rx in [&mut one, &mut two] {
        while let Some(b) = rx.recv().await {
            assert_eq!(b.unwrap().data.len(), 192);
            rest += 1;
        }
    }
    assert_eq!(rest, 10);
    // Streams that end give their window back.
    drop((one, two));
    all_given_back(&e).await;
    assert_eq!(collect(&e, request("demo", 1)).await.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampler_sizes_are_refused_without_being_made() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    // Issue 13: four billion clips per video.
    let mut req = request("demo", 1);
    req.sampler.kind = SamplerKind::RandomIndices;
    req.sampler.num_clips = 4_000_000_000;
    let t = std::time::Instant::now();
    let (code, m) = message(first(&e, req).await);
    assert_eq!(code, crate::error::Code::InvalidArgument);
    assert_eq!(
        m,
        "num_clips 4000000000 × frames_per_clip 2 = 8000000000 positions per sample exceed the limit of 1048576"
    );
    // Regular timestamps a picosecond apart: the count is computed, the clips never made; the first
    // sample's count ends the stream.
    let mut req = request("demo", 1);
    req.sampler.kind = SamplerKind::RegularTimestamps;
    req.sampler.num_clips = 0;
    req.sampler.seconds_between_clip_starts = Some(1e-12);
    let (code, m) = message(first(&e, req).await);
    assert_eq!(code, crate::error::Code::InvalidArgument);
    assert!(
        m.starts_with("sample 0 (\"chaplin.mp4\"): regular timestamps every 1e-12 s give ")
            && m.contains("clips of 2 frames per sample, more than the limit of 1048576 positions"),
        "{m}"
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(e.stats().frames_decoded, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_clip_plans_are_charged_to_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine_with(
        dir.path(),
        Limits {
            max_inflight_bytes: 100_000,
            ..Limits::default()
        },
    );
    // 50,000 clips of 2 frames a sample: a plan of 100,000 positions (4.8 MB charged), within the positions
    // limit, but past this budget: refused by name before it is made, where it used to be held unseen.
    let mut req = request("demo", 1);
    req.sampler.kind = SamplerKind::RegularIndices;
    req.sampler.num_clips = 50_000;
    let (code, m) = message(first(&e, req).await);
    assert_eq!(code, crate::error::Code::ResourceExhausted, "{m}");
    assert!(
        m.contains("StreamBatches clip plan of sample") && m.contains("up to 100000 positions"),
        "{m}"
    );
    assert_eq!(e.stats().frames_decoded, 0);
    // A plan that fits is served, and its charge given back with its stream.
    let big = Limits {
        max_inflight_bytes: 64 << 20,
        ..Limits::default()
    };
    let e = engine_with(dir.path(), big);
    let mut req = request("demo", 1);
    req.sampler.kind = SamplerKind::RegularIndices;
    req.sampler.num_clips = 5_000;
    let mut rx = start(&e, req, Peer::local()).await.unwrap();
    assert_eq!(rx.recv().await.unwrap().unwrap().clips.len(), 1);
    drop(rx);
    all_given_back(&e).await;
}

/// A finished stream's last batches (at most three batch outputs: the channel's two and one on the wire)
/// stay reserved until its reply has written them, through the reply's hold on the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_streams_last_batches_stay_reserved_until_written() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let sent = crate::budget::sent::Sent::new();
    // The reply's last message, not yet written.
    let unwritten = sent.wrap(bytes::Bytes::from_static(b"the last batch"));
    let mut rx = start_kept(&e, request("demo", 1), Peer::local(), Some(sent.keep()))
        .await
        .unwrap();
    let mut batch_bytes = 0;
    while let Some(b) = rx.recv().await {
        batch_bytes = b.unwrap().data.len() as u64;
    }
    assert!(batch_bytes > 0);
    assert_eq!(e.budget().in_use(), 3 * batch_bytes);
    drop(unwritten);
    drop(sent);
    assert_eq!(e.budget().in_use(), 0);
}
