//! The stream handler on the fake decoder: real indexes of the committed demo clips
//! (`tests/data/demo`: chaplin.mp4, flipping_a_pancake.mkv, nasa_13013.mp4, samples 0, 1, 2 in a
//! scan), frame k decoded as a solid image of value `fake_value(k)`, so every clip's pixels say which
//! frames were assembled.

use std::sync::Arc;

use super::*;
use crate::config::{CacheConfig, Config, DatasetConfig, DecodeConfig, Limits};
use crate::decode::fake::{fake_value, FakeBackend};
use crate::decode::fleet::BackendFactory;
use crate::request::Resize;
use crate::sample::{SamplerKind, ShortVideo};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/demo");
const VIDEOS: [&str; 3] = ["chaplin.mp4", "flipping_a_pancake.mkv", "nasa_13013.mp4"];
/// Output frames are 8x4 RGB: 96 bytes each.
const FRAME_BYTES: usize = 8 * 4 * 3;

/// An engine serving `demo` (a scan of the demo clips) and `gappy` (a manifest of chaplin.mp4, a
/// missing file and nasa_13013.mp4), decoding with the fake backend; shared-memory arenas in `dir`.
fn engine(dir: &std::path::Path) -> Arc<Engine> {
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
        },
        decode: DecodeConfig {
            threads: 2,
            threads_explicit: true,
            queue: 64,
            threads_per_decoder: 1,
            gpus: crate::config::GpuSpec::None,
            nvdec_sessions: 1,
        },
        limits: Limits::default(),
        shutdown_grace: std::time::Duration::from_secs(1),
        shm_dir: dir.to_path_buf(),
        state_dir: None,
        ops: Default::default(),
    };
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
    let mut rx = start(e, req).await.unwrap();
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
        let (_, index, _) = e.catalog().resolve("demo", v, None).await.unwrap();
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
    let mut rx = start(&e, req).await.unwrap();
    match rx.recv().await {
        Some(Err(Error::DataLoss(m))) => assert!(m.contains("missing.mp4"), "{m}"),
        other => panic!("expected DATA_LOSS, got {other:?}"),
    }
    assert!(rx.recv().await.is_none());
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
    let mut rx = start(&e, req).await.unwrap();
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
        e.shm().release(&r.arena, &[r.slot]).unwrap();
    }
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4, 5]
    );
    assert!(seen.iter().all(|s| s.1 < 4), "{seen:?}");
}
