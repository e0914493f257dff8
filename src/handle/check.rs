//! CheckDataset: a dataset's health checked inside the daemon ([`crate::check`]), its results written to
//! the daemon's store and taken into the catalogue at once, so the streams that follow sample only frames
//! that decode.
//!
//! Input: a [`CheckRequest`]. Output: a channel of [`CheckProgress`], one per video in the order they
//! finish. The check runs on `jobs` threads of its own (at most the decode threads) and stops when the
//! caller goes away or the server drains; a video being decoded then finishes first.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::check::{Shard, VideoReport};
use crate::engine::Engine;
use crate::error::Error;

/// What to check.
#[derive(Clone, Debug)]
pub struct CheckRequest {
    pub dataset: String,
    /// Videos decoded at once (clamped to 1..=decode threads).
    pub jobs: usize,
    pub shard: Shard,
}

/// One video checked.
#[derive(Clone, Debug)]
pub struct CheckProgress {
    pub report: VideoReport,
    /// Videos checked so far, and in all.
    pub done: u64,
    pub total: u64,
}

/// Starts the check; the receiver yields one item per video.
pub async fn check_dataset(
    engine: &Arc<Engine>,
    req: CheckRequest,
) -> Result<mpsc::Receiver<Result<CheckProgress, Error>>, Error> {
    let ds = engine.catalog().dataset(&req.dataset)?.clone();
    if crate::gulp::is_gulp_dir(&ds.root) {
        return Err(Error::InvalidArgument(format!(
            "dataset {:?} is a GulpIO dataset of stored frames; check it with `vserve gulp-check`",
            req.dataset
        )));
    }
    let samples = engine.catalog().samples(&req.dataset).await?;
    let mut videos: Vec<String> = samples
        .iter()
        .map(|s| s.video.to_owned())
        .filter(|v| req.shard.contains(v))
        .collect();
    videos.sort();
    videos.dedup();
    let jobs = req.jobs.clamp(1, engine.fleet_threads().max(1));
    tracing::info!(dataset = %req.dataset, videos = videos.len(), jobs, shard = ?req.shard, "checking a dataset");
    let (tx, rx) = mpsc::channel(16);
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || {
        let catalog = engine.catalog();
        let store = catalog.store().map(|s| s.as_ref());
        let mut checked = 0;
        crate::check::run(&ds, &videos, jobs, store, |report, record, done, total| {
            if let Some(r) = &record {
                catalog.learn(r);
            }
            checked = done;
            let sent = tx.blocking_send(Ok(CheckProgress {
                report,
                done: done as u64,
                total: total as u64,
            }));
            sent.is_ok() && !engine.is_draining()
        });
        if checked < videos.len() && engine.is_draining() {
            // Cut short by the daemon's shutdown: the client must not read the videos checked so far
            // as the whole dataset (an OK end would make `vserve check --daemon` exit 0).
            tracing::warn!(dataset = %ds.name, checked, total = videos.len(), "check cut short by shutdown");
            let _ = tx.blocking_send(Err(Error::ShuttingDown));
        }
    });
    Ok(rx)
}
