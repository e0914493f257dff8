//! CheckDataset: a dataset's health checked inside the daemon ([`crate::check`]), its results written to
//! the daemon's store and taken into the catalogue at once, so the streams that follow sample only frames
//! that decode.
//!
//! Input: a [`CheckRequest`]. Output: a channel of [`CheckProgress`], one per video in the order they
//! finish. The check runs on `jobs` threads of its own (at most the decode threads) and stops when the
//! caller goes away or the server drains; a video being decoded then finishes first.
//!
//! A check is background work next to the training traffic the daemon is for: its threads run at nice
//! [`super::BACKGROUND_NICE`], so the decode fleet's threads win the cores whenever both want them, and every video
//! it decodes takes a place from the catalogue's check places (the decode thread count, all calls
//! together, going round the clients), so N calls at once decode no more than one call's worth.
//! Eight CheckDataset calls of 2 jobs each raised another client's uncached GetClips p50 from 23 to
//! 169 ms when every call had threads of its own at full priority; 29 ms now (benches/background_load.py).

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
    /// Who asked (check places go round the clients).
    pub client: crate::peer::PeerKey,
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
    let (runtime, client) = (tokio::runtime::Handle::current(), req.client);
    let caller = tx.clone();
    tokio::task::spawn_blocking(move || {
        let catalog = engine.catalog();
        let store = catalog.store().map(|s| s.as_ref());
        let mut checked = 0;
        let decode_one =
            |ds: &crate::dataset::Dataset, video: &str, store: Option<&crate::store::Store>| {
                // Each call's threads are its own (run_each starts them): lowered for good, one call a
                // video (a syscall against decoding a whole video).
                crate::handle::lower_priority("a check thread");
                // A thread waiting for its place gives up when the caller goes away meanwhile, instead
                // of decoding one more video for nobody once its turn comes.
                let _place = runtime.block_on(async {
                    tokio::select! {
                        place = catalog.check_place(&client) => place,
                        () = caller.closed() => None,
                    }
                })?;
                if caller.is_closed() || engine.is_draining() {
                    return None;
                }
                Some(crate::check::check_one(ds, video, store))
            };
        crate::check::run_each(
            &ds,
            &videos,
            jobs,
            store,
            decode_one,
            |report, record, done, total| {
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
            },
        );
        if checked < videos.len() && engine.is_draining() {
            // Cut short by the daemon's shutdown: the client must not read the videos checked so far
            // as the whole dataset (an OK end would make `vserve check --daemon` exit 0).
            tracing::warn!(dataset = %ds.name, checked, total = videos.len(), "check cut short by shutdown");
            let _ = tx.blocking_send(Err(Error::ShuttingDown));
        }
    });
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::PeerKey;
    use std::time::Duration;

    /// Waits (up to 10 s) until `cond` holds.
    async fn until(what: &str, cond: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A check whose caller goes away while its thread waits for a check place leaves the queue at once
    /// (before, it decoded one more video for nobody once its turn came); a check still wanted waits on
    /// and reports its video.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_check_waiting_for_a_place_leaves_when_its_caller_does() {
        let dir = tempfile::tempdir().unwrap();
        crate::handle::tests::demo_video(dir.path(), "nasa.mp4");
        let engine = crate::handle::tests::engine(dir.path(), None);
        let catalog = engine.catalog();
        // The only place (one decode thread), held by another client's check.
        let held = catalog
            .check_place(&PeerKey::Process { pid: 1, start: 1 })
            .await
            .unwrap();
        let request = |pid| CheckRequest {
            dataset: "d".into(),
            jobs: 1,
            shard: Shard::ALL,
            client: PeerKey::Process { pid, start: 1 },
        };
        let gone = check_dataset(&engine, request(2)).await.unwrap();
        let mut kept = check_dataset(&engine, request(3)).await.unwrap();
        until("both checks wait for the place", || {
            catalog.checks_waiting() == 2
        })
        .await;
        drop(gone);
        until("the check whose caller left stops waiting", || {
            catalog.checks_waiting() == 1
        })
        .await;
        drop(held);
        let progress = tokio::time::timeout(Duration::from_secs(60), kept.recv())
            .await
            .expect("the check still wanted gets the place")
            .unwrap()
            .unwrap();
        assert_eq!(progress.report.video, "nasa.mp4");
        assert_eq!(progress.report.status, "ok");
        assert_eq!((progress.done, progress.total), (1, 1));
        assert!(kept.recv().await.is_none(), "one video, then the end");
        assert_eq!(catalog.checks_waiting(), 0);
    }
}
