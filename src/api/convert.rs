//! Proto ↔ domain conversion of requests and replies: transforms, clips and stream requests from their
//! messages (every enum value checked, named when unknown), and the small reply pieces back.

use crate::batch::{BatchSpec, DType, Layout};
use crate::cache::CachePolicy;
use crate::error::Error;
use crate::handle::stream::{OnError, StreamRequest};
use crate::request::{ClipRequest, ClipsRequest, Positions, Resize, Transform};
use crate::sample::{AugmentSpec, CropSpec, Remainder, SamplerKind, SamplerSpec, ShortVideo};
use crate::transport::shm::ShmRef;
use crate::transport::Transport;

use super::pb;

pub(super) fn transform_from_proto(t: Option<pb::Transform>) -> Result<Transform, Error> {
    let Some(t) = t else {
        return Ok(Transform::default());
    };
    let resize = match t.resize {
        None => Resize::Native,
        Some(pb::transform::Resize::Size(s)) => Resize::Exact {
            width: s.width,
            height: s.height,
        },
        Some(pb::transform::Resize::ShortSide(n)) => Resize::ShortSide(n),
    };
    let dtype = match pb::DType::try_from(t.dtype) {
        Ok(pb::DType::DtypeUint8) => DType::U8,
        Ok(pb::DType::DtypeFloat16) => DType::F16,
        Ok(pb::DType::DtypeFloat32) => DType::F32,
        Err(_) => return Err(Error::InvalidArgument(format!("unknown dtype {}", t.dtype))),
    };
    let layout = match pb::Layout::try_from(t.layout) {
        Ok(pb::Layout::Thwc) => Layout::Thwc,
        Ok(pb::Layout::Tchw) => Layout::Tchw,
        Err(_) => {
            return Err(Error::InvalidArgument(format!(
                "unknown layout {}",
                t.layout
            )))
        }
    };
    let per_channel = |name: &str, v: &[f32], default: f32| -> Result<[f32; 3], Error> {
        match v.len() {
            0 => Ok([default; 3]),
            1 => Ok([v[0]; 3]),
            3 => Ok([v[0], v[1], v[2]]),
            n => Err(Error::InvalidArgument(format!(
                "{name} has {n} values; give 1 or 3"
            ))),
        }
    };
    Ok(Transform {
        resize,
        rotate: !t.no_rotate,
        batch: BatchSpec {
            crop: t.center_crop.map(|c| (c.width, c.height)),
            hflip: t.hflip,
            dtype,
            mean: per_channel("mean", &t.mean, 0.0)?,
            std: per_channel("std", &t.std, 1.0)?,
            layout,
        },
    })
}

pub(super) fn clips_from_proto(req: pb::GetClipsRequest) -> Result<ClipsRequest, Error> {
    let clips = req
        .clips
        .into_iter()
        .map(|c| {
            let positions = match c.positions {
                Some(pb::clip_spec::Positions::Frames(f)) => Positions::Frames(f.indices),
                Some(pb::clip_spec::Positions::Times(t)) => Positions::Times(t.seconds),
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "clip of {:?} gives neither frames nor times",
                        c.video
                    )))
                }
            };
            Ok(ClipRequest {
                video: c.video,
                stream: c.stream,
                positions,
                expect_version: c.expect_version,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ClipsRequest {
        dataset: req.dataset,
        clips,
        transform: transform_from_proto(req.transform)?,
        shm: false,
        shm_reuse: false,
        cache_policy: cache_policy_from_proto(req.cache_policy)?,
    })
}

pub(super) fn dtype_to_proto(d: DType) -> i32 {
    (match d {
        DType::U8 => pb::DType::DtypeUint8,
        DType::F16 => pb::DType::DtypeFloat16,
        DType::F32 => pb::DType::DtypeFloat32,
    }) as i32
}

pub(super) fn layout_to_proto(l: Layout) -> i32 {
    (match l {
        Layout::Thwc => pb::Layout::Thwc,
        Layout::Tchw => pb::Layout::Tchw,
    }) as i32
}

pub(super) fn stats_to_proto(s: &crate::request::RequestStats) -> pb::RequestStats {
    pb::RequestStats {
        frames_decoded: s.frames_decoded,
        cache_hits: s.cache_hits,
        cache_misses: s.cache_misses,
        gop_runs: s.gop_runs,
        shared_frames: s.shared_frames,
        frames_skipped: s.frames_skipped,
    }
}

pub(super) fn transport_from_proto(t: i32) -> Result<Transport, Error> {
    match pb::Transport::try_from(t) {
        Ok(pb::Transport::Inline) => Ok(Transport::Inline),
        Ok(pb::Transport::Shm) => Ok(Transport::Shm),
        Err(_) => Err(Error::InvalidArgument(format!("unknown transport {t}"))),
    }
}

pub(super) fn cache_policy_from_proto(p: i32) -> Result<CachePolicy, Error> {
    match pb::CachePolicy::try_from(p) {
        Ok(pb::CachePolicy::Auto) => Ok(CachePolicy::Auto),
        Ok(pb::CachePolicy::OnePass) => Ok(CachePolicy::OnePass),
        Ok(pb::CachePolicy::Keep) => Ok(CachePolicy::Keep),
        Err(_) => Err(Error::InvalidArgument(format!("unknown cache policy {p}"))),
    }
}

pub(super) fn shm_to_proto(r: &ShmRef) -> pb::ShmSlot {
    pb::ShmSlot {
        path: r.path.display().to_string(),
        arena: r.arena.clone(),
        slot: r.slot,
        offset: r.offset,
        arena_bytes: r.arena_bytes,
        slots: r.slots,
    }
}

pub(super) fn stream_from_proto(req: pb::StreamBatchesRequest) -> Result<StreamRequest, Error> {
    let invalid = |m: String| Error::InvalidArgument(m);
    let s = req.sampler.unwrap_or_default();
    let kind = match pb::SamplerKind::try_from(s.kind) {
        Ok(pb::SamplerKind::SamplerRandomIndices) => SamplerKind::RandomIndices,
        Ok(pb::SamplerKind::SamplerRegularIndices) => SamplerKind::RegularIndices,
        Ok(pb::SamplerKind::SamplerRandomTimestamps) => SamplerKind::RandomTimestamps,
        Ok(pb::SamplerKind::SamplerRegularTimestamps) => SamplerKind::RegularTimestamps,
        Err(_) => return Err(invalid(format!("unknown sampler kind {}", s.kind))),
    };
    let short_video = match pb::ShortVideoPolicy::try_from(s.short_video) {
        Ok(pb::ShortVideoPolicy::ShortVideoRepeatLast) => ShortVideo::RepeatLast,
        Ok(pb::ShortVideoPolicy::ShortVideoWrap) => ShortVideo::Wrap,
        Ok(pb::ShortVideoPolicy::ShortVideoSkip) => ShortVideo::Skip,
        Err(_) => {
            return Err(invalid(format!(
                "unknown short-video policy {}",
                s.short_video
            )))
        }
    };
    let or_default = |v: u32, d: u32| if v == 0 { d } else { v };
    let positive = |v: f64| (v != 0.0).then_some(v);
    let sampler = SamplerSpec {
        kind,
        num_clips: if kind == SamplerKind::RegularTimestamps {
            0
        } else {
            or_default(s.num_clips, 1)
        },
        frames_per_clip: or_default(s.frames_per_clip, 1),
        frame_stride: or_default(s.frame_stride, 1),
        seconds_between_frames: positive(s.seconds_between_frames),
        seconds_between_clip_starts: positive(s.seconds_between_clip_starts),
        range_start: s.range_start,
        range_end: s.range_end,
        short_video,
    };
    let a = req.augment.unwrap_or_default();
    let crop = match a.crop {
        None => None,
        Some(pb::augment::Crop::RandomCrop(c)) => Some(CropSpec::Random {
            width: c.width,
            height: c.height,
        }),
        Some(pb::augment::Crop::RandomResizedCrop(r)) => {
            let size = r.size.unwrap_or_default();
            let or = |v: f32, d: f64| if v == 0.0 { d } else { v as f64 };
            Some(CropSpec::RandomResized {
                width: size.width,
                height: size.height,
                scale: (or(r.scale_min, 0.08), or(r.scale_max, 1.0)),
                ratio: (or(r.ratio_min, 3.0 / 4.0), or(r.ratio_max, 4.0 / 3.0)),
            })
        }
    };
    let remainder = match pb::ShardRemainder::try_from(req.shard_remainder) {
        Ok(pb::ShardRemainder::Uneven) => Remainder::Uneven,
        Ok(pb::ShardRemainder::Pad) => Remainder::Pad,
        Ok(pb::ShardRemainder::Drop) => Remainder::Drop,
        Err(_) => {
            return Err(invalid(format!(
                "unknown shard remainder {}",
                req.shard_remainder
            )))
        }
    };
    let on_error = match pb::OnError::try_from(req.on_error) {
        Ok(pb::OnError::Skip) => OnError::Skip,
        Ok(pb::OnError::Fail) => OnError::Fail,
        Err(_) => return Err(invalid(format!("unknown on_error policy {}", req.on_error))),
    };
    Ok(StreamRequest {
        dataset: req.dataset,
        sampler,
        transform: transform_from_proto(req.transform)?,
        augment: AugmentSpec {
            crop,
            random_hflip: a.random_hflip,
        },
        batch_size: req.batch_size as usize,
        drop_last: req.drop_last,
        seed: req.seed,
        epoch: req.epoch,
        rank: req.rank as usize,
        world_size: if req.world_size == 0 {
            1
        } else {
            req.world_size as usize
        },
        start_batch: req.start_batch,
        prefetch: if req.prefetch == 0 {
            2
        } else {
            req.prefetch as usize
        },
        shuffle: !req.no_shuffle,
        remainder,
        on_error,
        transport: transport_from_proto(req.transport)?,
        cache_policy: cache_policy_from_proto(req.cache_policy)?,
        worker: req.worker as u64,
        workers: (req.num_workers as u64).max(1),
        start_sample: req.start_sample,
        samples_fingerprint: req.samples_fingerprint,
    })
}
