//! The stream handler on the fake decoder: real indexes of the committed demo clips
//! (`tests/data/demo`: chaplin.mp4, flipping_a_pancake.mkv, nasa_13013.mp4, samples 0, 1, 2 in a
//! scan), frame k decoded as a solid image of value `fake_value(k)`, so every clip's pixels say which
//! frames were assembled.

use std::sync::Arc;

use super::*;
use crate::config::{CacheConfig, Config, DatasetConfig, DecodeConfig, Limits};
use crate::decode::fake::{fake_value, FakeBackend};
use crate::decode::fleet::BackendFactory;
use crate::peer::Peer;
use crate::request::Resize;
use crate::sample::{SamplerKind, ShortVideo};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/demo");
const VIDEOS: [&str; 3] = ["chaplin.mp4", "flipping_a_pancake.mkv", "nasa_13013.mp4"];
/// Output frames are 8x4 RGB: 96 bytes each.
const FRAME_BYTES: usize = 8 * 4 * 3;

/// An engine serving `demo` (a scan of the demo clips) and `gappy` (a manifest of chaplin.mp4, a
/// missing file and nasa_13013.mp4), decoding with the fake backend; shared-memory arenas in `dir`.
fn engine(dir: &std::path::Path) -> Arc<Engine> {
    engine_with(dir, Limits::default())
}

fn engine_with(dir: &std::path::Path, limits: Limits) -> Arc<Engine> {
    engine_serving(dir, limits, None)
}

/// [`engine_with`], also serving `extra` (name, root) when given.
fn engine_serving(
    dir: &std::path::Path,
    limits: Limits,
    extra: Option<(&str, &std::path::Path)>,
) -> Arc<Engine> {
    let manifest = dir.join("gappy.csv");
    std::fs::write(
        &manifest,
        "path\nchaplin.mp4\nmissing.mp4\nnasa_13013.mp4\n",
    )
    .unwrap();
    let config = Config {
        listen: vec![],
        datasets: vec![
            DatasetConfig {
                name: "demo".into(),
                root: DEMO.into(),
                manifest: None,
            },
            DatasetConfig {
                name: "gappy".into(),
                root: DEMO.into(),
                manifest: Some(manifest),
            },
        ],
        cache: CacheConfig {
            bytes: 64 << 20,
            index_bytes: 1 << 20,
            store_bytes: 1 << 20,
            admit_ppm: crate::config::DEFAULT_ADMIT_PPM,
        },
        decode: DecodeConfig {
            threads: 2,
            threads_explicit: true,
            queue: 64,
            threads_per_decoder: 1,
            gpus: crate::config::GpuSpec::None,
            nvdec_sessions: 1,
            deadline: std::time::Duration::from_secs(60),
            index_deadline: std::time::Duration::from_secs(600),
        },
        limits,
        shutdown_grace: std::time::Duration::from_secs(1),
        shm_dir: dir.to_path_buf(),
        state_dir: None,
        rescan_interval: std::time::Duration::ZERO,
        tenancy: Default::default(),
        ops: Default::default(),
    };
    let mut config = config;
    if let Some((name, root)) = extra {
        config.datasets.push(DatasetConfig {
            name: name.into(),
            root: root.to_path_buf(),
            manifest: None,
        });
    }
    let factory: BackendFactory = Arc::new(|_slot| Box::new(FakeBackend::default()));
    Engine::new(&config, factory).unwrap()
}

/// Regular indices, 2 clips of 2 consecutive frames per sample (frames [0, 1] and [n-2, n-1]), resized
/// to 8x4 uint8, in the dataset's order.
fn request(dataset: &str, batch_size: usize) -> StreamRequest {
    StreamRequest {
        dataset: dataset.into(),
        sampler: SamplerSpec {
            kind: SamplerKind::RegularIndices,
            num_clips: 2,
            frames_per_clip: 2,
            frame_stride: 1,
            seconds_between_frames: None,
            seconds_between_clip_starts: None,
            range_start: None,
            range_end: None,
            short_video: ShortVideo::RepeatLast,
        },
        transform: Transform {
            resize: Resize::Exact {
                width: 8,
                height: 4,
            },
            ..Transform::default()
        },
        augment: AugmentSpec::default(),
        batch_size,
        drop_last: false,
        seed: 7,
        epoch: 0,
        rank: 0,
        world_size: 1,
        cache_policy: crate::cache::CachePolicy::Auto,
        samples_fingerprint: None,
        start_batch: 0,
        prefetch: 2,
        shuffle: false,
        remainder: Remainder::Uneven,
        on_error: OnError::Skip,
        transport: Transport::Inline,
        worker: 0,
        workers: 1,
        start_sample: 0,
    }
}

/// Every batch of a stream, in order; panics on a stream error.
async fn collect(e: &Arc<Engine>, req: StreamRequest) -> Vec<StreamBatch> {
    let mut rx = start(e, req, Peer::local()).await.unwrap();
    let mut out = Vec::new();
    while let Some(b) = rx.recv().await {
        out.push(b.unwrap());
    }
    out
}

/// Frames in each demo video (from the real index).
async fn frame_counts(e: &Arc<Engine>) -> Vec<u64> {
    let mut n = Vec::new();
    for v in VIDEOS {
        let (_, index, _) = e
            .catalog()
            .resolve("demo", v, None, &crate::peer::PeerKey::Local)
            .await
            .unwrap();
        n.push(index.frame_count() as u64);
    }
    n
}

/// (sample, clip) of every slot of a batch.
fn slot_ids(b: &StreamBatch) -> Vec<(u64, u32)> {
    b.clips.iter().map(|c| (c.sample, c.clip)).collect()
}

/// What the fake decoder gives for a batch whose clips hold `frames`: each frame 8x4 of fake_value(k).
fn expected_pixels(frames: &[Vec<u64>]) -> Vec<u8> {
    frames
        .iter()
        .flatten()
        .flat_map(|&k| vec![fake_value(k as usize); FRAME_BYTES])
        .collect()
}

fn clip_frames(b: &StreamBatch) -> Vec<Vec<u64>> {
    b.clips.iter().map(|c| c.meta.frames.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_fill_slots_in_sample_then_clip_order() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let n = frame_counts(&e).await;
    let batches = collect(&e, request("demo", 4)).await;
    assert_eq!(batches.len(), 2);
    assert_eq!(
        batches.iter().map(slot_ids).collect::<Vec<_>>(),
        vec![vec![(0, 0), (0, 1), (1, 0), (1, 1)], vec![(2, 0), (2, 1)]]
    );
    let clip = |s: usize, c: u32| {
        if c == 0 {
            vec![0, 1]
        } else {
            vec![n[s] - 2, n[s] - 1]
        }
    };
    let want = [
        vec![clip(0, 0), clip(0, 1), clip(1, 0), clip(1, 1)],
        vec![clip(2, 0), clip(2, 1)],
    ];
    for (b, want) in batches.iter().zip(&want) {
        assert_eq!(&clip_frames(b), want);
        assert_eq!(b.batches_total, Some(2));
        assert_eq!(b.shape, vec![want.len() as u64, 2, 4, 8, 3]);
        assert_eq!(b.data, expected_pixels(want));
        assert!(b.skipped.is_empty());
        assert!(b.clips.iter().all(|c| c.replaced_by.is_none()));
    }
    let videos: Vec<&str> = batches
        .iter()
        .flat_map(|b| b.clips.iter().map(|c| c.meta.video.as_str()))
        .collect();
    assert_eq!(
        videos,
        [VIDEOS[0], VIDEOS[0], VIDEOS[1], VIDEOS[1], VIDEOS[2], VIDEOS[2]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_sample_is_replaced_by_the_next_readable_one_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let n = frame_counts(&e).await;
    let mut req = request("gappy", 3);
    req.sampler.num_clips = 1;
    let batches = collect(&e, req).await;
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    // Slot 1 keeps its own sample number; nasa_13013.mp4 (sample 2) fills it.
    assert_eq!(slot_ids(b), vec![(0, 0), (1, 0), (2, 0)]);
    let replaced: Vec<Option<u64>> = b.clips.iter().map(|c| c.replaced_by).collect();
    assert_eq!(replaced, vec![None, Some(2), None]);
    let videos: Vec<&str> = b.clips.iter().map(|c| c.meta.video.as_str()).collect();
    assert_eq!(videos, ["chaplin.mp4", "nasa_13013.mp4", "nasa_13013.mp4"]);
    assert_eq!(b.skipped.len(), 1);
    assert_eq!(
        (
            b.skipped[0].sample,
            b.skipped[0].video.as_str(),
            b.skipped[0].code.as_str()
        ),
        (1, "missing.mp4", "NOT_FOUND")
    );
    let frames = vec![vec![0, 1], vec![0, 1], vec![0, 1]];
    assert_eq!(clip_frames(b), frames);
    assert_eq!(b.data, expected_pixels(&frames));
    assert!(n[2] > 2);

    // Under on_error = fail the same sample ends the stream with DATA_LOSS naming it.
    let mut req = request("gappy", 3);
    req.on_error = OnError::Fail;
    let mut rx = start(&e, req, Peer::local()).await.unwrap();
    match rx.recv().await {
        Some(Err(Error::DataLoss(m))) => assert!(m.contains("missing.mp4"), "{m}"),
        other => panic!("expected DATA_LOSS, got {other:?}"),
    }
    assert!(rx.recv().await.is_none());
}

/// A stream whose client goes away with batches prepared but never handed out (one waiting in the
/// channel, the next in the producer) gives their slots back, so its arena, every slot free once the
/// client has released what it read, is pooled or removed at once. Before, those slots stayed taken
/// and the arena stayed retired, open and charged to the client, until its time to live (60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_of_batches_never_handed_out_are_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let mut req = request("demo", 1);
    req.transport = Transport::Shm;
    let mut rx = start(&e, req, Peer::local()).await.unwrap();
    let b = rx.recv().await.unwrap().unwrap();
    let r = b.shm.clone().expect("an shm batch");
    e.shm()
        .release(&r.arena, &[r.slot], &Peer::local())
        .unwrap();
    // The producer prepares the next batches meanwhile: one waits in the channel, the next ones
    // (prefetch 2) in the producer, each with its slot taken.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while rx.is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "the next batch was never prepared"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    drop(b);
    drop(rx);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    // Every arena still open is a pooled one, nobody's.
    while e.shm().open_arenas() != e.shm().spare_stream_arenas() as u64 {
        assert!(
            std::time::Instant::now() < until,
            "the stream's arena is still open: slots of batches never handed out are still taken"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_gives_the_tail_of_the_uninterrupted_stream() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let mut req = request("demo", 2);
    req.shuffle = true;
    let full = collect(&e, req.clone()).await;
    assert_eq!(full.len(), 3);

    // start_batch: exactly batches 1.. of the full stream, numbered as there.
    let tail = collect(
        &e,
        StreamRequest {
            start_batch: 1,
            ..req.clone()
        },
    )
    .await;
    assert_eq!(tail.len(), 2);
    for (t, f) in tail.iter().zip(&full[1..]) {
        assert_eq!(t.batch, f.batch);
        assert_eq!(slot_ids(t), slot_ids(f));
        assert_eq!(clip_frames(t), clip_frames(f));
        assert_eq!(t.data, f.data);
    }

    // start_sample: the epoch's order without its first sample, sharded and batched anew.
    let order = sample::epoch_order(3, req.seed, req.epoch, true);
    let after = collect(
        &e,
        StreamRequest {
            start_sample: 1,
            ..req.clone()
        },
    )
    .await;
    let samples: Vec<u64> = after
        .iter()
        .flat_map(|b| b.clips.iter().map(|c| c.sample))
        .collect();
    let o = |i: usize| order[i] as u64;
    assert_eq!(samples, vec![o(1), o(1), o(2), o(2)]);
    // The same samples' clips as in the full stream (a clip is keyed by its sample, not its slot).
    let by_sample = |bs: &[StreamBatch], s: u64| -> Vec<Vec<u64>> {
        bs.iter()
            .flat_map(|b| b.clips.iter())
            .filter(|c| c.sample == s)
            .map(|c| c.meta.frames.clone())
            .collect()
    };
    assert_eq!(by_sample(&after, o(2)), by_sample(&full, o(2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_split_the_batches_round_robin_from_the_start_batch() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let full = collect(&e, request("demo", 1)).await;
    assert_eq!(full.len(), 6);
    for (start_batch, worker, want) in [
        (0, 0, vec![0, 2, 4]),
        (0, 1, vec![1, 3, 5]),
        (1, 0, vec![1, 3, 5]),
        (1, 1, vec![2, 4]),
    ] {
        let got = collect(
            &e,
            StreamRequest {
                worker,
                workers: 2,
                start_batch,
                ..request("demo", 1)
            },
        )
        .await;
        let numbers: Vec<u64> = got.iter().map(|b| b.batch).collect();
        assert_eq!(
            numbers, want,
            "worker {worker} of 2 from batch {start_batch}"
        );
        for b in &got {
            let f = &full[b.batch as usize];
            assert_eq!(slot_ids(b), slot_ids(f));
            assert_eq!(b.data, f.data);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_batches_go_to_arena_slots_freed_by_release() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let inline = collect(&e, request("demo", 1)).await;
    let mut req = request("demo", 1);
    req.transport = Transport::Shm;
    req.prefetch = 1;
    // Six batches through an arena of prefetch + 3 = 4 slots: the stream goes on only because each
    // slot read is released.
    let mut rx = start(&e, req, Peer::local()).await.unwrap();
    let mut seen = Vec::new();
    let next = std::time::Duration::from_secs(20);
    while let Some(b) = tokio::time::timeout(next, rx.recv())
        .await
        .expect("the next batch (stalled: a released slot not reused?)")
    {
        let b = b.unwrap();
        let r = b
            .shm
            .clone()
            .expect("an shm batch says where its bytes are");
        assert!(b.data.is_empty());
        let file = std::fs::read(&r.path).unwrap();
        let nbytes = (b.shape.iter().product::<u64>()) as usize;
        let bytes = &file[r.offset as usize..][..nbytes];
        assert_eq!(bytes, &inline[b.batch as usize].data[..]);
        seen.push((b.batch, r.slot));
        e.shm()
            .release(&r.arena, &[r.slot], &Peer::local())
            .unwrap();
    }
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4, 5]
    );
    assert!(
        seen.iter()
            .all(|s| crate::transport::shm::slot_index(s.1) < 4),
        "{seen:?}"
    );
}

/// The stream's first item: a batch, or the error that ended it.
async fn first(e: &Arc<Engine>, req: StreamRequest) -> Result<StreamBatch, Error> {
    let mut rx = start(e, req, Peer::local()).await?;
    rx.recv()
        .await
        .expect("the stream sends a batch or an error")
}

fn message(r: Result<StreamBatch, Error>) -> (crate::error::Code, String) {
    match r {
        Ok(b) => panic!("expected an error, got batch {}", b.batch),
        Err(e) => (e.code(), e.to_string()),
    }
}

#[test]
fn a_worker_outside_num_workers_is_refused() {
    let limits = Limits::default();
    for (worker, workers) in [(3, 1), (2, 2), (1, 0)] {
        let req = StreamRequest {
            worker,
            workers,
            ..request("demo", 1)
        };
        match validate_request(&req, &limits) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains(&format!("worker {worker} is not in 0..")), "{m}")
            }
            other => panic!("worker {worker} of {workers}: {other:?}"),
        }
    }
    let ok = StreamRequest {
        worker: 1,
        workers: 2,
        ..request("demo", 1)
    };
    assert!(validate_request(&ok, &limits).is_ok());
}

#[tokio::test]
async fn a_panicking_producer_ends_the_stream_with_internal() {
    let (tx, mut rx) = mpsc::channel(1);
    let work = async {
        panic!("slot table out of step");
    };
    guarded(work, tx, "demo").await;
    match rx.recv().await {
        Some(Err(Error::Internal(m))) => assert!(m.contains("slot table out of step"), "{m}"),
        other => panic!("expected INTERNAL, got {other:?}"),
    }
    assert!(rx.recv().await.is_none());
    // A producer that ends normally adds nothing.
    let (tx, mut rx) = mpsc::channel(1);
    guarded(async {}, tx, "demo").await;
    assert!(rx.recv().await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_beyond_max_output_bytes_is_refused_before_work() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    // Issue 13: 16384 frames of 8192x8192 float32 in one clip: 13 TB.
    let mut req = request("demo", 1);
    req.sampler.num_clips = 1;
    req.sampler.frames_per_clip = 16_384;
    req.transform.resize = Resize::Exact {
        width: 8192,
        height: 8192,
    };
    req.transform.batch.dtype = crate::batch::DType::F32;
    for transport in [Transport::Inline, Transport::Shm] {
        let r = first(
            &e,
            StreamRequest {
                transport,
                ..req.clone()
            },
        )
        .await;
        let (code, m) = message(r);
        assert_eq!(code, crate::error::Code::InvalidArgument);
        assert_eq!(
            m,
            "a batch of 13194139533312 bytes (shape [1, 16384, 8192, 8192, 3], float32) exceeds the limit of 4294967296 bytes (max-output-bytes)"
        );
    }
    assert_eq!(e.stats().frames_decoded, 0);
    assert_eq!(e.budget().in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_size_batch_is_checked_when_its_size_is_known() {
    let dir = tempfile::tempdir().unwrap();
    // Native size: 8x4 frames are fine, the demo clips' own size is not (nasa: 960x540 and up).
    let limits = Limits {
        max_output_bytes: 100_000,
        ..Limits::default()
    };
    let e = engine_with(dir.path(), limits);
    let mut req = request("demo", 1);
    req.transform.resize = Resize::Native;
    let (code, m) = message(first(&e, req).await);
    assert_eq!(code, crate::error::Code::InvalidArgument);
    assert!(
        m.starts_with("a batch of ") && m.contains("(max-output-bytes)"),
        "{m}"
    );
    assert_eq!(e.stats().batches_sent, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_size_window_is_admitted_at_the_first_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (_, index, _) = engine(dir.path())
        .catalog()
        .resolve("demo", VIDEOS[0], None, &crate::peer::PeerKey::Local)
        .await
        .unwrap();
    let (w, h) = index.display_size();
    let frame = w as u64 * h as u64 * 3;
    // A batch holds 2 decoded frames while it is made and outputs 2 frames: its window (2 batches'
    // frames, 5 outputs) is admitted at the first batch, in two steps, and does not fit 4 frames.
    let e = engine_with(
        dir.path(),
        Limits {
            // And the stream's sample order: 3 samples, 4 bytes each.
            max_inflight_bytes: 4 * frame + 12,
            ..Limits::default()
        },
    );
    let mut req = request("demo", 1);
    req.transform.resize = Resize::Native;
    let (code, m) = message(first(&e, req).await);
    assert_eq!(code, crate::error::Code::ResourceExhausted);
    let batch = 2 * frame;
    // The batch's frames fit (2 batches' worth: 4 frames); its outputs then do not.
    assert_eq!(
        m,
        format!(
            "StreamBatches of \"demo\" (5 batches of {batch} bytes: prefetch 2 + 3, and 2 batches' decoded frames of {batch} bytes) needs {} bytes ({}), more than the whole budget, {} of {} in use (max-inflight-bytes)",
            5 * batch,
            crate::budget::human_bytes(5 * batch),
            4 * frame + 12,
            4 * frame + 12
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_of_the_samples_ahead_are_built_while_the_client_reads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("many");
    std::fs::create_dir(&root).unwrap();
    // Twelve samples, fewer than the builds run ahead: all of them are built ahead of the fill.
    let n = 12;
    assert!(n <= ahead::AHEAD_SAMPLES);
    for i in 0..n {
        let to = root.join(format!("v{i:02}.mp4"));
        if std::fs::hard_link(format!("{DEMO}/chaplin.mp4"), &to).is_err() {
            std::fs::copy(format!("{DEMO}/chaplin.mp4"), &to).unwrap();
        }
    }
    let e = engine_serving(dir.path(), Limits::default(), Some(("many", &root)));
    let mut req = request("many", 1);
    req.prefetch = 1;
    let mut rx = start(&e, req, Peer::local()).await.unwrap();
    let first = rx.recv().await.unwrap().unwrap();
    assert_eq!(first.clips[0].meta.video, "v00.mp4");
    // The client holds the stream and reads nothing more: the fill stops within a few batches (2 clips
    // per sample, 1 clip per batch), yet every sample's table gets built, by the builds ahead.
    let mut waited = 0;
    while e.catalog().index_builds() < n as u64 {
        assert!(
            waited < 600,
            "{} of {n} tables built after 60 s",
            e.catalog().index_builds()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        waited += 1;
    }
    assert_eq!(
        e.catalog().index_builds(),
        n as u64,
        "each table built once"
    );
    // The stream then reads every table from the cache: no build more.
    let mut batches = 1;
    while let Some(b) = rx.recv().await {
        b.unwrap();
        batches += 1;
    }
    assert_eq!(batches, 2 * n);
    assert_eq!(e.catalog().index_builds(), n as u64);
}

mod budget;

/// A large clip plan (4096 positions) is placed once and kept for the batches that take its clips one
/// by one: batches of one clip give the clips, frames and pixels of one batch of eight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_clip_plan_kept_across_batches_gives_the_clips_of_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let big = |batch_size| {
        let mut req = request("demo", batch_size);
        req.sampler.num_clips = 2048;
        req.sampler.frames_per_clip = 2;
        req
    };
    let mut rx = start(&e, big(1), Peer::local()).await.unwrap();
    let mut ones = Vec::new();
    for _ in 0..8 {
        ones.push(rx.recv().await.unwrap().unwrap());
    }
    drop(rx);
    let mut rx = start(&e, big(8), Peer::local()).await.unwrap();
    let eight = rx.recv().await.unwrap().unwrap();
    assert_eq!(
        ones.iter().flat_map(slot_ids).collect::<Vec<_>>(),
        (0..8).map(|c| (0, c)).collect::<Vec<_>>()
    );
    assert_eq!(slot_ids(&eight), (0..8).map(|c| (0, c)).collect::<Vec<_>>());
    assert_eq!(
        ones.iter().flat_map(clip_frames).collect::<Vec<_>>(),
        clip_frames(&eight)
    );
    assert_eq!(
        ones.iter().flat_map(|b| b.data.clone()).collect::<Vec<_>>(),
        eight.data
    );
}

#[test]
fn placed_plans_are_found_by_sample_and_key_and_the_oldest_goes_first() {
    let placed = slots::Placed::default();
    let a = placed.cell(1, &[7, 0, 1]);
    assert!(Arc::ptr_eq(&a, &placed.cell(1, &[7, 0, 1])), "kept");
    assert!(
        !Arc::ptr_eq(&a, &placed.cell(1, &[7, 0, 1, 5])),
        "another key"
    );
    assert!(
        !Arc::ptr_eq(&a, &placed.cell(2, &[7, 0, 1])),
        "another sample"
    );
    // a is the oldest of the three: PLACED_KEEP more push it out.
    for s in 10..10 + slots::PLACED_KEEP {
        placed.cell(s, &[7, 0, s as u64]);
    }
    assert!(!Arc::ptr_eq(&a, &placed.cell(1, &[7, 0, 1])), "pushed out");
}
