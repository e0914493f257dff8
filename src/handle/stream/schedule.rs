//! The rank's clip sequence cut into batches: which (shard position, clip) slots each batch holds,
//! for this worker's share. Fixed clip counts are computed; counted ones walk the shard, indexing each
//! sample to count its clips (and recording the samples that give none).

use std::sync::Arc;

use crate::error::Error;

use super::slots::{count_clips, fail_error, none_readable, skip_record};
use super::{Context, OnError, Skipped, Slots};

/// The rank's clip sequence cut into batches: which (shard position, clip) slots batch b holds. (Not
/// [`crate::plan`], which plans GOP runs.)
pub(super) struct Schedule {
    ctx: Arc<Context>,
    /// Clips per sample when fixed; otherwise counted per sample as the schedule walks.
    fixed: Option<u32>,
    batch: u64,
    /// Next (shard position, clip) to place, for counted schedules.
    pos: usize,
    clip: u32,
    /// Clips of the sample at `pos` (counted schedules).
    count_at_pos: Option<u32>,
}

type ScheduledBatch = Result<(u64, Slots, Vec<Skipped>), Error>;

impl Schedule {
    pub(super) async fn new(ctx: &Arc<Context>) -> Result<Schedule, Error> {
        let mut schedule = Schedule {
            ctx: ctx.clone(),
            fixed: ctx.req.sampler.fixed_clip_count(),
            batch: 0,
            pos: 0,
            clip: 0,
            count_at_pos: None,
        };
        if schedule.fixed.is_some() {
            schedule.batch = ctx.req.start_batch;
        } else {
            // Counted schedules walk the skipped batches (indexing, no decoding).
            for _ in 0..ctx.req.start_batch {
                if schedule.next_any_batch().await.transpose()?.is_none() {
                    break;
                }
            }
        }
        Ok(schedule)
    }

    pub(super) fn total_batches(&self) -> Option<u64> {
        let per = self.fixed? as u64;
        let clips = self.ctx.shard.len() as u64 * per;
        let b = self.ctx.req.batch_size as u64;
        Some(if self.ctx.req.drop_last {
            clips / b
        } else {
            clips.div_ceil(b)
        })
    }

    /// The next batch of this worker's share.
    pub(super) async fn next_batch(&mut self) -> Option<ScheduledBatch> {
        loop {
            let scheduled = self.next_any_batch().await?;
            let ours = match &scheduled {
                Ok((b, _, _)) => {
                    let req = &self.ctx.req;
                    (b - req.start_batch) % req.workers.max(1) == req.worker
                }
                Err(_) => true,
            };
            if ours {
                return Some(scheduled);
            }
        }
    }

    async fn next_any_batch(&mut self) -> Option<ScheduledBatch> {
        let b = self.ctx.req.batch_size;
        let batch = self.batch;
        if let Some(per) = self.fixed {
            let total_clips = self.ctx.shard.len() as u64 * per as u64;
            if batch >= self.total_batches().unwrap_or(0) {
                return None;
            }
            let first = batch * b as u64;
            let last = (first + b as u64).min(total_clips);
            self.batch += 1;
            let slots = (first..last)
                .map(|i| ((i / per as u64) as usize, (i % per as u64) as u32))
                .collect();
            return Some(Ok((batch, slots, Vec::new())));
        }
        let mut slots = Vec::with_capacity(b);
        let mut skipped = Vec::new();
        while slots.len() < b && self.pos < self.ctx.shard.len() {
            let count = match self.count_at_pos {
                Some(c) => c,
                None => {
                    let (c, failure) = count_clips(&self.ctx, self.pos).await;
                    if let Some(f) = failure {
                        let sample = self.ctx.sample_at(self.pos);
                        if f.is_fatal() {
                            return Some(Err(f.into_error()));
                        }
                        if self.ctx.req.on_error == OnError::Fail && !f.too_short {
                            return Some(Err(fail_error(&self.ctx, sample, &f)));
                        }
                        skipped.push(skip_record(&self.ctx, sample, &f));
                    }
                    self.count_at_pos = Some(c);
                    c
                }
            };
            if self.clip < count {
                slots.push((self.pos, self.clip));
                self.clip += 1;
            }
            if self.clip >= count {
                self.pos += 1;
                self.clip = 0;
                self.count_at_pos = None;
            }
        }
        if slots.is_empty() && batch == 0 && !skipped.is_empty() {
            // Not one sample of the shard gave a clip: say so, as the fixed-count samplers do when no
            // sample can fill a slot, rather than end OK with nothing and no skip report.
            let all_too_short = skipped.iter().all(|s| s.code == "TOO_SHORT");
            return Some(Err(none_readable(&self.ctx, skipped.last(), all_too_short)));
        }
        if slots.is_empty() || (self.ctx.req.drop_last && slots.len() < b) {
            return None;
        }
        self.batch += 1;
        Some(Ok((batch, slots, skipped)))
    }
}
