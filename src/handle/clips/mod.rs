//! GetClips: explicit clips of one dataset → one array.
//!
//! resolve and index every distinct video ([`crate::catalog`]) → positions to frame numbers → geometry
//! and output shape (refused before any decode when too large) → the bytes it will hold (decoded frames
//! until assembly, the output until sent) reserved from the in-flight [`crate::budget`] (refused with
//! RESOURCE_EXHAUSTED when they do not fit) → frames per video ([`crate::frames`]:
//! cache, single flight, fleet) → [`batch`] assembly, into a reply buffer or straight into a
//! shared-memory arena; frames only this request held (they bypassed the cache) go back to the
//! decoders' buffer pool ([`crate::decode::pool`]). A plain array over shared memory is assembled in
//! place instead (`in_place.rs`): its arena is taken before the fetch and the decoders write the frames
//! that bypass the cache straight into it. A video found damaged mid-request is marked (its next index
//! comes from a decode) and the whole request is resolved once more.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::batch;
use crate::catalog::Resolved;
use crate::decode::Frame;
use crate::engine::Engine;
use crate::error::{blocking, Error};
use crate::metrics::Timer;
use crate::peer::Peer;
use crate::request::{
    check_output_bytes, display_dims, frame_bytes, resolve_positions, ClipMeta, ClipsReply,
    ClipsRequest, RequestStats,
};
use crate::transport::{deliver, Destination};

mod in_place;
use in_place::{plain, InPlace};

/// Serves one GetClips request. Counted in progress by the caller ([`Engine::request_started`]: the
/// RPC layer's count lasts until the reply's last byte is written).
pub async fn get_clips(
    engine: &Arc<Engine>,
    req: ClipsRequest,
    peer: &Peer,
) -> Result<ClipsReply, Error> {
    match get_clips_once(engine, &req, peer).await {
        // The damaged video is now indexed by decoding; frame numbers may have changed, so the whole
        // request is resolved again.
        Err(Error::Damaged(_)) => get_clips_once(engine, &req, peer).await,
        other => other,
    }
}

async fn get_clips_once(
    engine: &Arc<Engine>,
    req: &ClipsRequest,
    peer: &Peer,
) -> Result<ClipsReply, Error> {
    let limits = engine.limits();
    req.validate(limits)?;
    let tenant = engine.frames().new_tenant(true, peer.key.client_id());
    engine.catalog().dataset(&req.dataset)?;

    // Index every distinct video once, in parallel on blocking threads. `clip_video[i]` is the
    // position of clip i's video in `distinct`.
    let mut distinct: Vec<(String, Option<u32>)> = Vec::new();
    let mut position: HashMap<(&str, Option<u32>), usize> = HashMap::new();
    let clip_video: Vec<usize> = req
        .clips
        .iter()
        .map(|c| {
            *position.entry((&c.video, c.stream)).or_insert_with(|| {
                distinct.push((c.video.clone(), c.stream));
                distinct.len() - 1
            })
        })
        .collect();
    let videos = engine
        .catalog()
        .resolve_all(&req.dataset, &distinct, &peer.key)
        .await?;

    // Positions → frame numbers, of the version of each file the client read its table from.
    let mut clip_frames: Vec<Vec<usize>> = Vec::with_capacity(req.clips.len());
    for (c, &vi) in req.clips.iter().zip(&clip_video) {
        let (id, index, _) = &videos[vi];
        if let Some(expected) = c.expect_version.filter(|&v| v != id.version()) {
            return Err(Error::FailedPrecondition(format!(
                "video {:?} of dataset {:?} is not the version {expected:#x} the request read its table from (it is {:#x} now): the file was replaced or changed; probe it again",
                c.video,
                req.dataset,
                id.version()
            )));
        }
        clip_frames.push(resolve_positions(&c.video, index, &c.positions)?);
    }

    // Geometry per video, and the common output size.
    let mut geometries = Vec::with_capacity(videos.len());
    for (i, (_, index, _)) in videos.iter().enumerate() {
        geometries.push(req.transform.geometry(index, &distinct[i].0, limits)?);
    }
    let (w, h) = display_dims(geometries[clip_video[0]]);
    for (c, &vi) in req.clips.iter().zip(&clip_video) {
        let g = geometries[vi];
        // With a crop, frames of other sizes are fine as long as each holds the crop (batch checks).
        if req.transform.batch.crop.is_none() && display_dims(g) != (w, h) {
            let (w2, h2) = display_dims(g);
            return Err(Error::InvalidArgument(format!(
                "clips have different frame sizes ({w}x{h} and {w2}x{h2} for {:?}); request an output size",
                c.video
            )));
        }
    }
    let t = clip_frames[0].len();
    for &vi in &clip_video {
        let (cw, ch) = display_dims(geometries[vi]);
        batch::output_shape(1, t, cw, ch, &req.transform.batch)?;
    }
    let shape = batch::output_shape(req.clips.len(), t, w, h, &req.transform.batch)?;
    let nbytes = check_output_bytes("output", &shape, req.transform.batch.dtype, limits)?;
    let shm = req.shm
        && !engine
            .shm()
            .inline_instead(nbytes as usize, peer, "GetClips");

    // Frames, per video.
    let mut wanted: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); videos.len()];
    for (frames, &vi) in clip_frames.iter().zip(&clip_video) {
        wanted[vi].extend(frames.iter().copied());
    }
    // Every decoded frame is held at its decoded size until assembly (a resize to 4096x4096 then a
    // 1x1 crop holds 48 MiB a frame), and the output until it is sent.
    let held: u64 = wanted
        .iter()
        .zip(&geometries)
        .map(|(set, &g)| (set.len() as u64).saturating_mul(frame_bytes(g)))
        .fold(0, u64::saturating_add);
    let who = format!("GetClips (decoded frames {held} bytes + output {nbytes} bytes)",);
    let mut reservation = engine
        .budget()
        .try_reserve(
            held.saturating_add(nbytes),
            crate::budget::Who::new(who).client(peer),
        )
        .await?;

    // A plain array over shared memory is laid out frame after frame: its arena is taken now and each
    // video's runs that bypass the cache convert their frames straight into it.
    let in_place = match shm && plain(&req.transform.batch) {
        true => Some(InPlace::reserve(
            engine,
            req,
            peer,
            nbytes as usize,
            (w, h),
            &clip_frames,
            &clip_video,
            videos.len(),
        )?),
        false => None,
    };

    // Every video's runs are queued before any is awaited, so the fleet decodes them in parallel.
    let mut fetches = Vec::with_capacity(videos.len());
    for (i, ((id, _, source), wanted)) in videos.iter().zip(wanted).enumerate() {
        fetches.push(engine.frames().fetch(
            id,
            source,
            geometries[i],
            wanted,
            tenant,
            req.cache_policy,
            in_place.as_ref().map(|p| p.sinks[i].clone()),
        ));
    }
    let mut stats = RequestStats::default();
    let mut per_video: Vec<HashMap<usize, Arc<Frame>>> = Vec::with_capacity(videos.len());
    let fetched_all = futures::future::join_all(fetches).await;
    for (i, fetched) in fetched_all.iter().enumerate() {
        if let Err(Error::Damaged(detail)) = fetched {
            engine.catalog().mark_damaged(&videos[i].0, detail);
        }
    }
    for fetched in fetched_all {
        let (frames, s) = fetched?;
        stats.add(&s);
        per_video.push(frames);
    }

    if let Some(in_place) = in_place {
        let metas = clip_metas(req, &clip_frames, &clip_video, &videos);
        let (to, frames) = (engine.clone(), per_video);
        let shm = blocking(move || in_place.finish(&to, &clip_frames, &clip_video, frames)).await?;
        reservation.shrink_to(nbytes);
        return Ok(ClipsReply {
            shape: shape.to_vec(),
            data: Vec::new(),
            shm: Some(shm),
            nbytes,
            clips: metas,
            stats,
            reservation: Some(reservation),
        });
    }

    // Assemble.
    let metas = clip_metas(req, &clip_frames, &clip_video, &videos);
    let mut frames_by_clip: Vec<Vec<Arc<Frame>>> = Vec::with_capacity(req.clips.len());
    for ((c, frames), &vi) in req.clips.iter().zip(&clip_frames).zip(&clip_video) {
        let mut list = Vec::with_capacity(frames.len());
        for k in frames {
            let f = per_video[vi].get(k).cloned().ok_or_else(|| {
                Error::Internal(format!("frame {k} of {:?} missing after decode", c.video))
            })?;
            list.push(f);
        }
        frames_by_clip.push(list);
    }
    // The clips hold the only references the request keeps, so frames nobody else holds (those that
    // bypassed the cache) can go back to the buffer pool after assembly.
    drop(per_video);
    let spec = req.transform.batch.clone();
    let assembly_timer = Timer::start();
    let (to_shm, reuse, shared, owner) = (shm, req.shm_reuse, engine.clone(), peer.clone());
    let (shape, data, shm) = blocking(move || {
        // The frames are dropped when this closure ends; only the output stays.
        let augs = batch::centre_augs(&frames_by_clip, &spec)?;
        let shape = batch::augmented_shape(&frames_by_clip, &augs, &spec)?;
        let nbytes = batch::shape_bytes(&shape, &spec);
        let to = if to_shm {
            Destination::Reply {
                shm: shared.shm(),
                reusable: reuse,
                owner: &owner,
            }
        } else {
            Destination::Inline
        };
        let (shape, delivered) = deliver(to, nbytes, shared.metrics(), |buf| {
            Ok::<_, Error>(batch::assemble_augmented_into(
                &frames_by_clip,
                &augs,
                &spec,
                buf,
            )?)
        })?;
        drop(frames_by_clip); // frames only this reply held: their buffers go back to the pool
        let (data, shm) = delivered.into_parts();
        Ok((shape, data, shm))
    })
    .await?;
    assembly_timer.observe(&engine.metrics().batch_assembly);
    reservation.shrink_to(nbytes);
    Ok(ClipsReply {
        shape,
        data,
        shm,
        nbytes,
        clips: metas,
        stats,
        reservation: Some(reservation),
    })
}
/// Per clip, its frames' numbers and times.
fn clip_metas(
    req: &ClipsRequest,
    clip_frames: &[Vec<usize>],
    clip_video: &[usize],
    videos: &[Resolved],
) -> Vec<ClipMeta> {
    req.clips
        .iter()
        .zip(clip_frames)
        .zip(clip_video)
        .map(|((c, frames), &vi)| {
            let index = &videos[vi].1;
            ClipMeta {
                video: c.video.clone(),
                frames: frames.iter().map(|&k| k as u64).collect(),
                pts: frames.iter().map(|&k| index.frames.at(k).pts).collect(),
                pts_seconds: frames
                    .iter()
                    .map(|&k| index.seconds(index.frames.at(k).pts))
                    .collect(),
                duration_seconds: frames
                    .iter()
                    .map(|&k| index.seconds(index.frames.at(k).stated_duration))
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
