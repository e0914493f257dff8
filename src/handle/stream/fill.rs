//! Assembling one batch from its filled slots: per clip slot, in order, the clip's frames, its
//! augmentation (keyed by the slot's own sample and clip) and the stream's fixed centre crop and flip,
//! then [`batch::assemble_augmented`] into a reply buffer or, for shared-memory streams, straight into
//! a slot of the stream's arena (waiting for the client to release one).
//!
//! Input: the batch number, its [`Slots`] and what [`super::slots::fill_slots`] made ready. Output: the
//! [`StreamBatch`] (its `batches_total` is set by the producer). Invariants: clip i of the array is slot
//! i of the batch, and its metadata (video, frames, pts, crop, flip) is what was assembled; the array
//! is allocated (or an arena slot sized) only after its bytes passed `--max-output-bytes` and fit the
//! stream's window in the in-flight budget.

use std::sync::Arc;

use crate::batch;
use crate::error::{blocking, Error};
use crate::request::{check_output_bytes, display_dims, ClipMeta, Transform};
use crate::sample::{self, ClipAug, CropBox, Purpose, Rng};
use crate::transport::shm::SlotHold;
use crate::transport::{deliver, Destination, Transport};

use super::slots::Filled;
use super::{Context, Slots, StreamBatch, StreamClip};

/// Assembles batch `b` from its filled slots.
pub(super) async fn assemble(
    ctx: &Arc<Context>,
    b: u64,
    slots: &Slots,
    filled: Filled,
) -> Result<StreamBatch, Error> {
    let Filled {
        ready: filled,
        frames,
        skipped,
        stats,
    } = filled;
    // Assemble in slot order.
    let mut clip_frames = Vec::with_capacity(slots.len());
    let mut augs = Vec::with_capacity(slots.len());
    let mut clips = Vec::with_capacity(slots.len());
    for &(p, clip) in slots {
        let r = &filled[&p];
        let got = &frames[&(p, r.sample)];
        let numbers = &r.clips[clip as usize % r.clips.len()];
        let mut list = Vec::with_capacity(numbers.len());
        for k in numbers {
            list.push(
                got.get(k)
                    .cloned()
                    .ok_or_else(|| Error::Internal(format!("frame {k} missing after decode")))?,
            );
        }
        let slot_sample = ctx.sample_at(p);
        let (w, h) = display_dims(r.geometry);
        let mut rng = Rng::keyed(
            Purpose::Augment,
            &[ctx.req.seed, ctx.req.epoch, slot_sample as u64, clip as u64],
        );
        let aug = match sample::draw_augment(&ctx.req.augment, w, h, &mut rng) {
            Ok(a) => a,
            Err(e) => return Err(Error::InvalidArgument(e.to_string())),
        };
        let aug = with_centre_crop(aug, &ctx.req.transform, w, h)?;
        let s = ctx.samples.get(r.sample);
        clips.push(StreamClip {
            meta: ClipMeta {
                video: s.video.to_owned(),
                frames: numbers.iter().map(|&k| k as u64).collect(),
                pts: numbers.iter().map(|&k| r.index.frames.at(k).pts).collect(),
                pts_seconds: numbers
                    .iter()
                    .map(|&k| r.index.seconds(r.index.frames.at(k).pts))
                    .collect(),
                duration_seconds: numbers
                    .iter()
                    .map(|&k| r.index.seconds(r.index.frames.at(k).stated_duration))
                    .collect(),
            },
            label: s.label.map(str::to_owned),
            label_index: s.label_index,
            sample: slot_sample as u64,
            clip,
            replaced_by: (r.sample != slot_sample).then_some(r.sample as u64),
            crop: aug.crop,
            flipped: aug.flip,
        });
        clip_frames.push(list);
        augs.push(aug);
    }
    let spec = ctx.req.transform.batch.clone();
    // The batch's size is known now (at native size it depends on the videos): checked against the
    // per-batch limit and the stream's window before anything of that size exists.
    let shape = batch::augmented_shape(&clip_frames, &augs, &spec)?;
    let nbytes = check_output_bytes("a batch", &shape, spec.dtype, ctx.engine.limits())?;
    ctx.ensure_window(nbytes, 0).await?;
    let nbytes = usize::try_from(nbytes)
        .map_err(|_| Error::InvalidArgument(format!("a batch of {nbytes} bytes")))?;
    let arena = match ctx.req.transport {
        Transport::Shm => ctx.arena_for(nbytes, clip_frames.len())?,
        Transport::Inline => None,
    };
    let to = if let Some(arena) = arena {
        // Assembled in place, in a slot of the stream's arena (waiting for the client to free one).
        let idle = ctx.engine.stream_idle();
        let Some(slot) = super::within(idle, arena.acquire()).await else {
            tracing::info!(dataset = %ctx.req.dataset, client = %ctx.peer.describe(), "stream ended: its client released no slot");
            return Err(super::idle_error(idle, "released no shared-memory slot"));
        };
        // Given back if the batch never reaches the client (the stream stopped while preparing it).
        let hold = SlotHold::new(ctx.engine.shm(), &arena, slot, &ctx.peer);
        Some((arena, slot, hold))
    } else {
        None
    };
    // Frames only this batch holds (they bypassed the cache) go back to the buffer pool once assembled.
    drop(frames);
    let engine = ctx.engine.clone();
    // The hold goes with the write: dropped (the request gone) only once nothing writes the slot.
    let (shape, data, shm, slot) = blocking(move || {
        let (to, hold) = match to {
            Some((arena, slot, hold)) => (Destination::Slot { arena, slot }, Some(hold)),
            None => (Destination::Inline, None),
        };
        let (shape, delivered) = deliver(to, nbytes, engine.metrics(), |buf| {
            Ok::<_, Error>(batch::assemble_augmented_into(
                &clip_frames,
                &augs,
                &spec,
                buf,
            )?)
        })?;
        drop(clip_frames); // frames only this batch held: their buffers go back to the pool
        let (data, shm) = delivered.into_parts();
        Ok((shape, data, shm, hold))
    })
    .await?;
    Ok(StreamBatch {
        batch: b,
        batches_total: None,
        shape,
        data,
        clips,
        skipped,
        stats,
        shm,
        slot,
        samples_fingerprint: 0,
    })
}

/// A stream's fixed transform (centre crop, horizontal flip) as a per-clip augmentation.
fn with_centre_crop(mut aug: ClipAug, t: &Transform, w: u32, h: u32) -> Result<ClipAug, Error> {
    if let Some((cw, ch)) = t.batch.crop {
        if cw > w || ch > h {
            return Err(Error::InvalidArgument(format!(
                "crop {cw}x{ch} does not fit in frames of {w}x{h}"
            )));
        }
        aug.crop = Some(CropBox::centred(w, h, cw, ch));
    }
    if t.batch.hflip {
        aug.flip = !aug.flip;
    }
    Ok(aug)
}
