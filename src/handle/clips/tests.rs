//! GetClips over the fake backend: single flight, the cache, budgets, replies in place.

use super::*;
use crate::cache::CachePolicy;
use crate::config::{CacheConfig, DatasetConfig, DecodeConfig};
use crate::config::{Config, Limits};
use crate::decode::fake::{fake_value, FakeBackend};
use crate::decode::fleet::BackendFactory;
use crate::decode::Geometry;
use crate::request::{ClipRequest, Positions, Resize, Transform};

/// An engine over the committed demo clips whose decoding is the fake backend: the index is real
/// (nasa_13013.mp4, keyframes 0 and 240 of 390), frame k is a solid image of value fake_value(k).
fn engine(delay_ms: u64) -> Arc<Engine> {
    engine_with(delay_ms, 2)
}

fn engine_with(delay_ms: u64, threads: usize) -> Arc<Engine> {
    engine_limited(delay_ms, threads, Limits::default())
}

fn engine_limited(delay_ms: u64, threads: usize, limits: Limits) -> Arc<Engine> {
    let config = Config {
        listen: vec![],
        datasets: vec![DatasetConfig {
            name: "demo".into(),
            root: concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/demo").into(),
            manifest: None,
        }],
        cache: CacheConfig {
            bytes: 64 << 20,
            index_bytes: 1 << 20,
            store_bytes: 1 << 20,
            admit_ppm: crate::config::DEFAULT_ADMIT_PPM,
        },
        decode: DecodeConfig {
            threads,
            threads_explicit: true,
            queue: 16,
            threads_per_decoder: 1,
            gpus: crate::config::GpuSpec::None,
            nvdec_sessions: 1,
            deadline: std::time::Duration::from_secs(60),
            index_deadline: std::time::Duration::from_secs(600),
        },
        limits,
        shutdown_grace: std::time::Duration::from_secs(1),
        shm_dir: {
            // A directory of the tests' own (the registry sweeps what it is given).
            let d = std::env::temp_dir().join(format!("vserve-unit-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            d
        },
        state_dir: None,
        rescan_interval: std::time::Duration::ZERO,
        tenancy: Default::default(),
        ops: Default::default(),
    };
    let factory: BackendFactory = Arc::new(move |_slot| {
        Box::new(FakeBackend {
            delay: std::time::Duration::from_millis(delay_ms),
        })
    });
    Engine::new(&config, factory).unwrap()
}

fn request(frames: &[u64]) -> ClipsRequest {
    ClipsRequest {
        shm: false,
        shm_reuse: false,
        cache_policy: CachePolicy::Auto,
        dataset: "demo".into(),
        clips: vec![ClipRequest {
            video: "nasa_13013.mp4".into(),
            stream: None,
            positions: Positions::Frames(frames.to_vec()),
            expect_version: None,
        }],
        transform: Transform {
            resize: Resize::Exact {
                width: 8,
                height: 4,
            },
            ..Transform::default()
        },
    }
}

/// A request that joins a run still queued behind another tenant's backlog is served at its own
/// turn, not at the end of that backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_runs_start_at_the_joiners_turn() {
    let e = engine_with(30, 1);
    let (id, _, source) = e
        .catalog()
        .resolve("demo", "nasa_13013.mp4", None, &crate::peer::PeerKey::Local)
        .await
        .unwrap();
    let a = e.frames().new_tenant(false, 0);
    let b = e.frames().new_tenant(false, 0);
    let geometry = |w: u32| Geometry {
        scaled_width: w,
        scaled_height: 4,
        rotation: 0,
        mirror: false,
        resized: false,
    };
    // Tenant a queues ten runs (one per geometry); the last is the one b will want.
    let mut backlog = Vec::new();
    for w in 1..=10 {
        let (e, id, source) = (e.clone(), id.clone(), source.clone());
        backlog.push(tokio::spawn(async move {
            e.frames()
                .fetch(
                    &id,
                    &source,
                    geometry(w),
                    BTreeSet::from([5]),
                    a,
                    CachePolicy::Auto,
                    None,
                )
                .await
                .map(|_| ())
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let (got, stats) = e
        .frames()
        .fetch(
            &id,
            &source,
            geometry(10),
            BTreeSet::from([5]),
            b,
            CachePolicy::Auto,
            None,
        )
        .await
        .unwrap();
    assert_eq!(got[&5].data[0], fake_value(5));
    assert_eq!(stats.shared_frames, 1, "b joined a's queued run");
    let runs_done = e.frames().stats().gop_runs;
    assert!(
        runs_done <= 4,
        "b waited for {runs_done} runs of a's backlog"
    );
    for h in backlog {
        h.await.unwrap().unwrap();
    }
    assert_eq!(e.frames().stats().gop_runs, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decodes_gop_runs_once_then_serves_from_cache() {
    let e = engine(0);
    let first = get_clips(&e, request(&[250, 5, 7]), &Peer::local())
        .await
        .unwrap();
    // Runs: keyframe 0 → 7 (8 frames) and keyframe 240 → 250 (11 frames).
    assert_eq!(first.stats.frames_decoded, 8 + 11);
    assert_eq!(first.stats.gop_runs, 2);
    assert_eq!(first.shape, vec![1, 3, 4, 8, 3]);
    let per = 4 * 8 * 3;
    for (i, k) in [250usize, 5, 7].iter().enumerate() {
        assert!(first.data[i * per..(i + 1) * per]
            .iter()
            .all(|&v| v == fake_value(*k)));
    }
    let second = get_clips(&e, request(&[250, 5, 7]), &Peer::local())
        .await
        .unwrap();
    assert_eq!(second.stats.frames_decoded, 0);
    assert_eq!(second.stats.cache_hits, 3);
    assert_eq!(second.data, first.data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_share_one_pass() {
    let e = engine(300);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            get_clips(&e, request(&[3, 9]), &Peer::local()).await
        }));
    }
    let mut decoded = 0;
    let mut shared = 0;
    let mut datas = Vec::new();
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        decoded += r.stats.frames_decoded;
        shared += r.stats.shared_frames;
        datas.push(r.data);
    }
    assert_eq!(decoded, 10, "one pass of keyframe 0 → frame 9");
    assert_eq!(
        shared, 6,
        "three requests took both frames from the one pass"
    );
    assert!(datas.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(e.stats().gop_runs, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_run_grows_to_serve_a_later_request() {
    // One decode thread, busy with GOP 240 while both requests for GOP 0 arrive.
    let e = engine_with(500, 1);
    let blocker = {
        let e = e.clone();
        tokio::spawn(async move { get_clips(&e, request(&[250]), &Peer::local()).await })
    };
    // Wait (not sleep) for each state, so a loaded machine cannot reorder the steps.
    let until = |cond: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "state not reached");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    };
    // The blocker's run has started (left the queue).
    until(&|| e.frames().inflight_started() == [true]);
    let first = {
        let e = e.clone();
        tokio::spawn(async move { get_clips(&e, request(&[3]), &Peer::local()).await })
    };
    // The first request's run is registered and queued behind the blocker.
    until(&|| {
        let started = e.frames().inflight_started();
        started.len() == 2 && started.iter().filter(|s| !**s).count() == 1
    });
    let second = get_clips(&e, request(&[9]), &Peer::local()).await.unwrap();
    let first = first.await.unwrap().unwrap();
    blocker.await.unwrap().unwrap();
    // The queued run 0 → 3 grew to 0 → 9 before it started: one pass served both.
    assert_eq!(first.stats.frames_decoded, 10);
    assert_eq!(second.stats.frames_decoded, 0);
    assert_eq!(second.stats.shared_frames, 1);
    assert!(second.data.iter().all(|&v| v == fake_value(9)));
    assert!(first.data.iter().all(|&v| v == fake_value(3)));
    assert_eq!(e.stats().gop_runs, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_bad_requests_before_work() {
    let e = engine(0);
    let many = vec![0u64; 1_000_000];
    assert!(matches!(
        get_clips(&e, request(&many), &Peer::local()).await,
        Err(Error::InvalidArgument(_))
    ));
    let mut huge = request(&[0]);
    huge.transform.resize = Resize::Exact {
        width: 100_000,
        height: 100_000,
    };
    assert!(matches!(
        get_clips(&e, huge, &Peer::local()).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        get_clips(&e, request(&[390]), &Peer::local()).await,
        Err(Error::OutOfRange(_))
    ));
    let mut outside = request(&[0]);
    outside.clips[0].video = "../demo/nasa_13013.mp4".into();
    assert!(matches!(
        get_clips(&e, outside, &Peer::local()).await,
        Err(Error::PermissionDenied(_))
    ));
    assert_eq!(e.stats().frames_decoded, 0);
    assert!(get_clips(&e, request(&[1]), &Peer::local()).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoded_frames_are_admitted_before_decoding() {
    // Issue 13's shape, smaller: 10 frames resized to 4096x4096 (48 MiB each) to keep a 1x1 crop.
    let e = engine_limited(
        0,
        2,
        Limits {
            max_inflight_bytes: 64 << 20,
            ..Limits::default()
        },
    );
    let mut req = request(&(0..10).collect::<Vec<u64>>());
    req.transform.resize = Resize::Exact {
        width: 4096,
        height: 4096,
    };
    req.transform.batch.crop = Some((1, 1));
    let t = std::time::Instant::now();
    match get_clips(&e, req, &Peer::local()).await {
        Err(Error::Overloaded(m)) => assert_eq!(
            m,
            "GetClips (decoded frames 503316480 bytes + output 30 bytes) needs 503316510 bytes (480.0 MiB), more than the whole budget, 0 of 67108864 in use (max-inflight-bytes)"
        ),
        other => panic!("expected RESOURCE_EXHAUSTED, got {:?}", other.map(|r| r.shape)),
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(e.stats().frames_decoded, 0);
    assert_eq!(e.budget().in_use(), 0);
}

/// The bytes of a shared-memory reply, as a client maps them.
fn shm_bytes(reply: &ClipsReply) -> Vec<u8> {
    let r = reply.shm.as_ref().expect("a shared-memory reply");
    let file = std::fs::read(&r.path).unwrap();
    file[r.offset as usize..r.offset as usize + reply.nbytes as usize].to_vec()
}

fn expected(frames: &[u64]) -> Vec<u8> {
    frames
        .iter()
        .flat_map(|&k| vec![fake_value(k as usize); 4 * 8 * 3])
        .collect()
}

/// A plain shared-memory reply whose frames bypass the cache is decoded straight into its arena:
/// frames listed twice, frames of two clips of one video, and frames from the cache land where they
/// belong, and nothing is decoded into the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pass_shm_replies_are_decoded_in_place() {
    let e = engine(0);
    // Frame 3 enters the cache first (an ordinary request).
    get_clips(&e, request(&[3]), &Peer::local()).await.unwrap();
    let mut req = request(&[250, 3, 5, 5]);
    req.clips.push(req.clips[0].clone());
    req.clips[1].positions = Positions::Frames(vec![7, 250, 1, 5]);
    req.shm = true;
    req.cache_policy = CachePolicy::OnePass;
    let before = e.stats();
    let reply = get_clips(&e, req.clone(), &Peer::local()).await.unwrap();
    assert_eq!(reply.shape, vec![2, 4, 4, 8, 3]);
    assert_eq!(
        shm_bytes(&reply),
        expected(&[250, 3, 5, 5, 7, 250, 1, 5]),
        "every position holds its frame"
    );
    let after = e.stats();
    // Distinct decoded frames 250, 5, 7, 1 went in place; 3 came from the cache.
    assert_eq!(after.frames_in_place - before.frames_in_place, 4);
    assert_eq!(reply.stats.cache_hits, 1);
    assert_eq!(after.cache_admitted, before.cache_admitted);
    assert_eq!(after.cache_bypassed - before.cache_bypassed, 4);
    // The same request inline, or with a crop (not plain), is assembled from frames: same bytes.
    let mut inline = req.clone();
    inline.shm = false;
    let inline = get_clips(&e, inline, &Peer::local()).await.unwrap();
    assert_eq!(inline.data, shm_bytes(&reply));
    let mut cropped = req.clone();
    cropped.transform.batch.crop = Some((8, 4));
    let cropped = get_clips(&e, cropped, &Peer::local()).await.unwrap();
    assert_eq!(shm_bytes(&cropped), shm_bytes(&reply));
    assert_eq!(e.stats().frames_in_place, after.frames_in_place);
    // Admitted (the default policy for a request this small): frames enter the cache, none in place.
    let mut kept = req.clone();
    kept.cache_policy = CachePolicy::Keep;
    let kept = get_clips(&e, kept, &Peer::local()).await.unwrap();
    assert_eq!(shm_bytes(&kept), shm_bytes(&reply));
    assert_eq!(e.stats().frames_in_place, after.frames_in_place);
    assert!(e.stats().cache_admitted > after.cache_admitted);
}

/// A request that joins a run writing in place for another request still gets its frames, and the
/// first request's reply is intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_writing_in_place_is_shared_with_a_joiner() {
    let e = engine(300);
    let mut first = request(&[2, 4, 6]);
    first.shm = true;
    first.cache_policy = CachePolicy::OnePass;
    let a = {
        let e = e.clone();
        tokio::spawn(async move { get_clips(&e, first, &Peer::local()).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let second = get_clips(&e, request(&[4, 6]), &Peer::local())
        .await
        .unwrap();
    let a = a.await.unwrap().unwrap();
    assert_eq!(shm_bytes(&a), expected(&[2, 4, 6]));
    assert_eq!(second.data, expected(&[4, 6]));
    assert_eq!(second.stats.shared_frames, 2, "the joiner decoded nothing");
    assert_eq!(e.stats().frames_in_place, 3);
}

/// A cancelled in-place request leaves no arena behind once its run returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_in_place_request_frees_its_arena() {
    let e = engine(200);
    let mut req = request(&[2, 4, 6]);
    req.shm = true;
    req.cache_policy = CachePolicy::OnePass;
    let files = |e: &Engine| {
        std::fs::read_dir(e.shm().dir())
            .unwrap()
            .filter(|f| {
                !f.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count()
    };
    let task = {
        let e = e.clone();
        tokio::spawn(async move { get_clips(&e, req, &Peer::local()).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(files(&e), 1, "the reply's arena is taken before decoding");
    task.abort();
    let _ = task.await;
    // The run was queued or decoding: its sink keeps the arena until it returns, then it goes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while files(&e) != 0 {
        assert!(std::time::Instant::now() < deadline, "the arena stayed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(e.stats().shm_arenas, 0);
    // The daemon serves on.
    assert!(get_clips(&e, request(&[1]), &Peer::local()).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_holds_its_bytes_until_it_is_dropped() {
    let e = engine(0);
    let reply = get_clips(&e, request(&[3, 9]), &Peer::local())
        .await
        .unwrap();
    assert_eq!(reply.nbytes, 2 * 4 * 8 * 3);
    // The decoded frames were given back after assembly; the output is held with the reply.
    assert_eq!(e.budget().in_use(), reply.nbytes);
    drop(reply);
    assert_eq!(e.budget().in_use(), 0);
}
