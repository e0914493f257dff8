//! Property tests of request validation (issue 13): whatever a client sends, validation does not panic,
//! and what it accepts stays within the limits the daemon admits memory on: output bytes within
//! `max-output-bytes`, decoded frames and outputs within the in-flight budget, a sample's planned
//! positions within `sample::MAX_SAMPLE_POSITIONS`, and the sampler's counts computed without making
//! the clips (the clips it then makes are exactly that many).
//!
//! Inputs are drawn from the whole range of each field (NaN and infinite floats, u32/u64 extremes) mixed
//! with small values, so both sides of every check are reached. Cases: `FUZZ_CASES` (default 2000) per
//! property; the first failing case is shrunk and printed by proptest.

use proptest::prelude::*;
use vserve::batch::{self, BatchSpec, DType, Layout};
use vserve::budget::Budget;
use vserve::config::Limits;
use vserve::handle::stream::{validate_request, OnError, StreamRequest};
use vserve::index::{FrameEntry, IndexMethod, SeekMode, VideoIndex};
use vserve::request::{
    array_bytes, check_output_bytes, display_dims, frame_bytes, ClipRequest, ClipsRequest,
    Positions, Resize, Transform,
};
use vserve::sample::{
    self, AugmentSpec, CropSpec, Purpose, Remainder, Rng, SampleError, SamplerKind, SamplerSpec,
    ShortVideo, VideoFacts, MAX_SAMPLE_POSITIONS, POSITION_BYTES,
};
use vserve::transport::Transport;

/// `cases()` cases, no regression files (a failure prints its shrunk input).
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases())
    }
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// Mostly small valid values, sometimes 0 or anything.
fn some_u32(small: u32) -> impl Strategy<Value = u32> {
    prop_oneof![24 => 1..=small, 1 => Just(0), 1 => any::<u32>()]
}

fn some_u64(small: u64) -> impl Strategy<Value = u64> {
    prop_oneof![24 => 1..=small, 1 => Just(0), 1 => any::<u64>()]
}

/// A rank or worker: mostly 0, sometimes up to 3, sometimes anything.
fn mostly_zero() -> impl Strategy<Value = u64> {
    prop_oneof![6 => Just(0u64), 2 => 0u64..=3, 1 => any::<u64>()]
}

/// Mostly a sane positive number; sometimes negative, tiny, huge, NaN or infinite.
fn some_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        24 => 0.01..100.0f64,
        1 => -100.0..0.0f64,
        1 => 0.0..1e-9f64,
        1 => any::<f64>(),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
    ]
}

/// Mostly absent; sometimes a whole number (an index sampler's range), sometimes any float.
fn some_range() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        4 => Just(None),
        1 => (-50i32..200).prop_map(|v| Some(v as f64)),
        1 => some_f64().prop_map(Some),
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    (
        prop_oneof![3 => Just(16_384usize), 1 => 1usize..=20_000],
        prop_oneof![3 => Just(4_096usize), 1 => 1usize..=5_000],
        prop_oneof![3 => Just(8_192u32), 1 => 1u32..=20_000],
        prop_oneof![
            6 => Just(4u64 << 30),
            1 => 1u64..=1 << 20,
            1 => 1u64..=1 << 40,
            1 => any::<u64>()
        ],
        prop_oneof![3 => Just(8usize), 1 => 1usize..=64],
        prop_oneof![Just(1u64 << 30), 1u64..=1 << 40],
    )
        .prop_map(
            |(max_frames, max_clips, max_side, max_output_bytes, max_prefetch, inflight)| Limits {
                max_frames,
                max_clips,
                max_side,
                max_output_bytes,
                max_prefetch,
                max_streams: 64,
                max_inflight_bytes: inflight,
            },
        )
}

fn transform() -> impl Strategy<Value = Transform> {
    let resize = prop_oneof![
        Just(Resize::Native),
        (some_u32(600), some_u32(600)).prop_map(|(width, height)| Resize::Exact { width, height }),
        some_u32(600).prop_map(Resize::ShortSide),
    ];
    let dtype = prop_oneof![Just(DType::U8), Just(DType::F16), Just(DType::F32)];
    let layout = prop_oneof![Just(Layout::Thwc), Just(Layout::Tchw)];
    let mean = prop_oneof![
        24 => Just([0.0f32; 3]),
        2 => Just([0.5f32; 3]),
        1 => any::<[f32; 3]>()
    ];
    let std = prop_oneof![
        24 => Just([1.0f32; 3]),
        2 => Just([0.25f32; 3]),
        1 => any::<[f32; 3]>()
    ];
    let crop = prop_oneof![3 => Just(None), 1 => (some_u32(300), some_u32(300)).prop_map(Some)];
    (
        resize,
        any::<bool>(),
        crop,
        any::<bool>(),
        dtype,
        mean,
        std,
        layout,
    )
        .prop_map(
            |(resize, rotate, crop, hflip, dtype, mean, std, layout)| Transform {
                resize,
                rotate,
                batch: BatchSpec {
                    crop,
                    hflip,
                    dtype,
                    mean,
                    std,
                    layout,
                },
            },
        )
}

/// A video's table as the decoder's geometry sees it: a coded size and a rotation.
fn video() -> impl Strategy<Value = VideoIndex> {
    (
        prop_oneof![4 => 1u32..=2000, 1 => any::<u32>()],
        prop_oneof![4 => 1u32..=2000, 1 => any::<u32>()],
        prop_oneof![Just(0u32), Just(90), Just(180), Just(270)],
    )
        .prop_map(|(width, height, rotation)| VideoIndex {
            stream: 0,
            codec: "h264".into(),
            pixel_format: "yuv420p".into(),
            width,
            height,
            rotation,
            mirror: false,
            time_base: (1, 25),
            avg_fps: 25.0,
            frames: (0..4)
                .map(|k| FrameEntry {
                    pts: k,
                    duration: 1,
                    key: k == 0,
                    stated_duration: 1,
                })
                .collect(),
            keyframes: vec![0].into(),
            declared_frames: 0,
            seek: SeekMode::ByPts,
            method: IndexMethod::PacketScan,
            h264_nal_length: None,
            damaged: false,
        })
}

fn positions() -> impl Strategy<Value = Positions> {
    prop_oneof![
        4 => proptest::collection::vec(some_u64(10), 1..40).prop_map(Positions::Frames),
        4 => proptest::collection::vec(some_f64(), 1..40).prop_map(Positions::Times),
        1 => Just(Positions::Frames(Vec::new())),
    ]
}

fn clips_request() -> impl Strategy<Value = ClipsRequest> {
    (
        (1usize..6, positions()).prop_map(|(n, p)| vec![p; n]),
        transform(),
        any::<bool>(),
    )
        .prop_map(|(positions, transform, shm)| ClipsRequest {
            dataset: "d".into(),
            clips: positions
                .into_iter()
                .map(|positions| ClipRequest {
                    video: "v.mp4".into(),
                    stream: None,
                    positions,
                    expect_version: None,
                })
                .collect(),
            transform,
            shm,
            shm_reuse: false,
            cache_policy: Default::default(),
        })
}

fn sampler() -> impl Strategy<Value = SamplerSpec> {
    let kind = prop_oneof![
        Just(SamplerKind::RandomIndices),
        Just(SamplerKind::RegularIndices),
        Just(SamplerKind::RandomTimestamps),
        Just(SamplerKind::RegularTimestamps),
    ];
    let policy = prop_oneof![
        Just(ShortVideo::RepeatLast),
        Just(ShortVideo::Wrap),
        Just(ShortVideo::Skip),
    ];
    (
        kind,
        some_u32(64),
        some_u32(64),
        some_u32(8),
        proptest::option::of(some_f64()),
        prop_oneof![4 => some_f64().prop_map(Some), 1 => Just(None)],
        some_range(),
        some_range(),
        policy,
    )
        .prop_map(
            |(kind, num_clips, f, stride, between, starts, range_start, range_end, policy)| {
                SamplerSpec {
                    kind,
                    num_clips,
                    frames_per_clip: f,
                    frame_stride: stride,
                    seconds_between_frames: between,
                    seconds_between_clip_starts: starts,
                    range_start,
                    range_end,
                    short_video: policy,
                }
            },
        )
}

fn augment() -> impl Strategy<Value = AugmentSpec> {
    let crop = prop_oneof![
        4 => Just(None),
        1 => (some_u32(300), some_u32(300))
            .prop_map(|(width, height)| Some(CropSpec::Random { width, height })),
        1 => (
            some_u32(300),
            some_u32(300),
            prop_oneof![(0.01..1.0f64, 0.01..1.0f64), (some_f64(), some_f64())],
            prop_oneof![(0.5..1.0f64, 1.0..2.0f64), (some_f64(), some_f64())]
        )
            .prop_map(
                |(width, height, scale, ratio)| Some(CropSpec::RandomResized {
                    width,
                    height,
                    scale,
                    ratio
                })
            ),
    ];
    (crop, any::<bool>()).prop_map(|(crop, random_hflip)| AugmentSpec { crop, random_hflip })
}

fn stream_request() -> impl Strategy<Value = StreamRequest> {
    (
        sampler(),
        transform(),
        augment(),
        (
            prop_oneof![8 => 1usize..=16, 1 => 0usize..=100_000],
            any::<bool>(),
        ),
        (mostly_zero(), some_u64(4)),
        (
            prop_oneof![8 => 1usize..=8, 1 => 0usize..=80],
            mostly_zero(),
            some_u64(4),
        ),
        any::<bool>(),
    )
        .prop_map(
            |(
                sampler,
                transform,
                augment,
                (batch_size, drop_last),
                (rank, world),
                (prefetch, worker, workers),
                shm,
            )| {
                StreamRequest {
                    dataset: "d".into(),
                    sampler,
                    transform,
                    augment,
                    batch_size,
                    drop_last,
                    seed: 1,
                    epoch: 2,
                    rank: rank as usize,
                    world_size: world as usize,
                    start_batch: 0,
                    prefetch,
                    shuffle: true,
                    remainder: Remainder::Uneven,
                    on_error: OnError::Skip,
                    transport: if shm {
                        Transport::Shm
                    } else {
                        Transport::Inline
                    },
                    worker,
                    workers,
                    start_sample: 0,
                    cache_policy: Default::default(),
                    samples_fingerprint: None,
                }
            },
        )
}

/// A video's view for the samplers: frames, rate and span, including degenerate ones.
fn facts() -> impl Strategy<Value = VideoFacts> {
    (
        1usize..=100_000,
        0usize..=10,
        prop_oneof![4 => 1.0..120.0f64, 1 => some_f64()],
        some_f64(),
        prop_oneof![4 => 0.0..100_000.0f64, 1 => some_f64()],
    )
        .prop_map(|(frames, first_frame, avg_fps, begin, length)| VideoFacts {
            frames,
            first_frame,
            avg_fps,
            begin,
            end: begin + length,
        })
}

/// Runs `check` on `cases()` drawn inputs; it says whether validation accepted the input. Fails on the
/// first failing case (shrunk), and when fewer than `min_accepted` of the cases were accepted (the
/// properties would then hold vacuously).
fn run<S: Strategy>(
    strategy: S,
    min_accepted: f64,
    check: impl Fn(S::Value) -> Result<bool, TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let cases = cases();
    let accepted = std::sync::atomic::AtomicU32::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let result = runner.run(&strategy, |input| {
        if check(input)? {
            accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let accepted = accepted.into_inner();
    eprintln!("{accepted} of {cases} cases accepted");
    assert!(
        accepted as f64 >= min_accepted * cases as f64,
        "only {accepted} of {cases} cases were accepted by validation"
    );
}

/// GetClips: validation, geometry and the byte counts the handler admits on.
fn check_clips(
    (req, limits, index): (ClipsRequest, Limits, VideoIndex),
) -> Result<bool, TestCaseError> {
    if req.validate(&limits).is_err() {
        return Ok(false);
    }
    let t = req.clips[0].positions.len();
    prop_assert!(t > 0 && req.clips.len() <= limits.max_clips);
    prop_assert!(t * req.clips.len() <= limits.max_frames);
    let Ok(g) = req.transform.geometry(&index, "v.mp4", &limits) else {
        return Ok(false);
    };
    let (w, h) = display_dims(g);
    prop_assert!(w >= 1 && h >= 1 && w <= limits.max_side && h <= limits.max_side);
    let Ok(shape) = batch::output_shape(req.clips.len(), t, w, h, &req.transform.batch) else {
        return Ok(false);
    };
    let exact: u128 = shape.iter().map(|&d| d as u128).product::<u128>()
        * req.transform.batch.dtype.size() as u128;
    prop_assert_eq!(
        array_bytes(&shape, req.transform.batch.dtype) as u128,
        exact.min(u64::MAX as u128)
    );
    let Ok(output) = check_output_bytes("output", &shape, req.transform.batch.dtype, &limits)
    else {
        prop_assert!(exact > limits.max_output_bytes as u128);
        return Ok(false);
    };
    prop_assert!(output <= limits.max_output_bytes);
    // At most every position a distinct frame, each held at the decoded size until assembly.
    let held = ((t * req.clips.len()) as u64).saturating_mul(frame_bytes(g));
    prop_assert!(
        held as u128 <= (limits.max_frames as u128) * (limits.max_side as u128).pow(2) * 3
    );
    let budget = Budget::new(limits.max_inflight_bytes, std::time::Duration::ZERO);
    match budget.try_reserve_now(held.saturating_add(output), "GetClips") {
        Ok(r) => {
            prop_assert!(r.bytes() <= limits.max_inflight_bytes);
            prop_assert_eq!(budget.in_use(), r.bytes());
        }
        Err(e) => prop_assert_eq!(e.code().name(), "RESOURCE_EXHAUSTED"),
    }
    prop_assert_eq!(budget.in_use(), 0);
    Ok(true)
}

/// StreamBatches: validation, the window it admits, and each accepted sampler's counts and clips.
fn check_stream(
    (req, limits, facts, frame): (StreamRequest, Limits, VideoFacts, (u32, u32)),
) -> Result<bool, TestCaseError> {
    let Ok(footprint) = validate_request(&req, &limits) else {
        return Ok(false);
    };
    let f = req.sampler.frames_per_clip as u64;
    prop_assert!(req.batch_size >= 1 && req.batch_size <= limits.max_clips);
    prop_assert!(req.batch_size as u64 * f <= limits.max_frames as u64);
    prop_assert!(req.rank < req.world_size);
    prop_assert!(req.worker < req.workers.max(1));
    prop_assert!(req.prefetch >= 1 && req.prefetch <= limits.max_prefetch);
    prop_assert_eq!(footprint.batches_held, req.prefetch as u64 + 3);
    if let Some(b) = footprint.batch_bytes {
        prop_assert!(b <= limits.max_output_bytes);
        prop_assert!(footprint.window_bytes() >= Some(b));
    }
    // Planning: a sample's positions, bounded by the parameters alone for fixed counts.
    let n = req.sampler.num_clips.max(1) as u64;
    prop_assert!(n * f <= MAX_SAMPLE_POSITIONS);
    prop_assert!(n * f * POSITION_BYTES <= MAX_SAMPLE_POSITIONS * POSITION_BYTES);

    // The sampler on a video: its count first, without making anything.
    let started = std::time::Instant::now();
    let count = sample::clip_count(&req.sampler, &facts);
    let made = sample::clips_for(&req.sampler, &facts, &mut Rng::keyed(Purpose::Clips, &[1]));
    match (count, made) {
        (Ok(n), Ok(clips)) => {
            prop_assert!(n.saturating_mul(f) <= MAX_SAMPLE_POSITIONS);
            prop_assert_eq!(clips.len() as u64, n);
            for c in &clips {
                prop_assert_eq!(c.len() as u64, f);
            }
        }
        (Ok(n), Err(SampleError::TooMany(_))) => {
            prop_assert!(n.saturating_mul(f) > MAX_SAMPLE_POSITIONS);
        }
        (_, Err(SampleError::TooShort(_))) | (Err(_), _) => {}
        (Ok(n), Err(e)) => prop_assert!(false, "{n} clips counted, then {e:?}"),
    }
    prop_assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // Each clip's augmentation on frames of some size: a crop inside the frame, or a refusal.
    let (w, h) = frame;
    match sample::draw_augment(&req.augment, w, h, &mut Rng::keyed(Purpose::Augment, &[3])) {
        Ok(aug) => {
            if let Some(c) = aug.crop {
                prop_assert!(c.width >= 1 && c.height >= 1);
                prop_assert!(c.x + c.width <= w && c.y + c.height <= h);
            }
            if let Some(CropSpec::RandomResized { width, height, .. }) = req.augment.crop {
                prop_assert_eq!(aug.resize_to, Some((width, height)));
            }
        }
        Err(e) => prop_assert!(matches!(e, SampleError::Invalid(_))),
    }
    Ok(true)
}

/// Runs `f` on a thread with a large stack: the nested strategies' value trees are deep in debug builds.
fn big_stack(f: impl FnOnce() + Send + 'static) {
    let t = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(f)
        .expect("spawn the fuzz thread");
    if let Err(panic) = t.join() {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn accepted_clip_requests_stay_within_the_limits() {
    big_stack(|| run((clips_request(), limits(), video()), 0.1, check_clips));
}

#[test]
fn accepted_stream_requests_stay_within_the_limits() {
    big_stack(|| {
        let frame = (1u32..=2000, 1u32..=2000);
        run(
            (stream_request(), limits(), facts(), frame),
            0.1,
            check_stream,
        )
    });
}

proptest! {
    #![proptest_config(config())]

    /// The budget's count stays exact under any sequence of reservations, shrinks and drops.
    #[test]
    fn the_budget_never_overcommits(
        capacity in 1u64..=1 << 40,
        steps in proptest::collection::vec((some_u64(1 << 41), any::<bool>(), 0u64..=100), 1..40),
    ) {
        let budget = Budget::new(capacity, std::time::Duration::ZERO);
        let mut held = Vec::new();
        for (bytes, keep, shrink) in steps {
            if let Ok(mut r) = budget.try_reserve_now(bytes, "x") {
                if shrink < 50 {
                    r.shrink_to(r.bytes() / 100 * shrink);
                }
                if keep {
                    held.push(r);
                }
            }
            let sum: u64 = held.iter().map(|r| r.bytes()).sum();
            prop_assert_eq!(budget.in_use(), sum);
            prop_assert!(sum <= capacity);
        }
        drop(held);
        prop_assert_eq!(budget.in_use(), 0);
    }
}
