//! Resolving a request's videos: a lookup first, then, only for a video whose table is neither cached
//! nor stored, an index build in its client's turn.
//!
//! Input: a dataset, a video (or several, for GetClips) and the client asking ([`PeerKey`]). Output:
//! each video's [`Resolved`].
//!
//! - The lookup opens the file and finds its table in the index cache or the store: a video indexed
//!   once costs an open, however many unindexed videos other clients wait on. Lookups run on blocking
//!   threads, at most [`LOOKUPS_PER_THREAD`] per decode thread at a time, under the index deadline.
//! - A lookup that finds the table being built for another request waits for that build to end (at
//!   most the index deadline) without a place, then looks again: several clients asking for one new
//!   video at once took a place each, all but one to wait inside the cache for the one build, and kept
//!   other clients' builds waiting behind it.
//! - A build takes one of the [`Gate`]'s places (as many as decode threads), which go round the waiting
//!   clients, so one client's many unindexed videos do not queue another's behind them all.
//! - Each runs within `--index-deadline` (the lookup and the build each; waiting for a place does not
//!   count): past it the request fails with DEADLINE_EXCEEDED, the permit or place is released, the
//!   file is remembered as stalled and the thread is left to return on its own (counted with the stuck
//!   index builds: a lookup stuck in `open` holds a blocking thread as surely).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;

use super::gate::Place;
use super::{Catalog, Resolved, STALLED_FOR};
use crate::cache::VideoId;
use crate::error::Error;
use crate::journal::{FileKey, JournalSlot};
use crate::metrics::Timer;
use crate::peer::PeerKey;

/// Lookups (file opens and cache or store reads, no build) in flight per decode thread.
pub const LOOKUPS_PER_THREAD: usize = 8;

/// Where an index build stands, shared by its blocking thread and the request awaiting it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BuildState {
    Running,
    Done,
    /// The request gave up at the deadline; the thread is still inside the build.
    Abandoned,
}

/// What an index build tells the request awaiting it as it goes: the file's identity once opened, and
/// the crash-journal slot it recorded the file in (marked stalled if the request gives up).
#[derive(Default)]
pub(super) struct BuildProbe {
    pub key: OnceLock<FileKey>,
    pub journal: Mutex<Option<Arc<JournalSlot>>>,
    /// Set by a lookup that found the table being built by another request: sees that build end.
    pub in_progress: Mutex<Option<tokio::sync::watch::Receiver<()>>>,
}

/// Tables being built now, each with a receiver that sees its build end.
pub(super) type UnderWay = Mutex<HashMap<Arc<VideoId>, tokio::sync::watch::Receiver<()>>>;

/// A table's entry among those being built, taken out when the build ends (its sender dropped then
/// tells the lookups waiting for it).
pub(super) struct Building<'a> {
    map: &'a UnderWay,
    id: Arc<VideoId>,
    _done: tokio::sync::watch::Sender<()>,
}

impl<'a> Building<'a> {
    pub fn enter(map: &'a UnderWay, id: &Arc<VideoId>) -> Building<'a> {
        let (tx, rx) = tokio::sync::watch::channel(());
        map.lock().insert(id.clone(), rx);
        Building {
            map,
            id: id.clone(),
            _done: tx,
        }
    }
}

impl Drop for Building<'_> {
    fn drop(&mut self) {
        self.map.lock().remove(&self.id);
    }
}

/// What a lookup or build holds until it ends: a lookup permit or a build place.
enum Held {
    Lookup(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit),
    Build(#[allow(dead_code)] Place),
}

/// A lookup or index build under way on a blocking thread. Its deadline holds whether or not the
/// request still waits: a request that goes away first (a client's cancel or deadline) leaves a task
/// that keeps the deadline for it (`Drop`), so a thread stuck for good (a hung network file system)
/// does not keep its lookup permit or build place for ever, out of sight of `stuck_builds`: once all
/// of them were held so, every resolve, of indexed videos too, waited with no end.
struct Build {
    catalog: Arc<Catalog>,
    /// Taken when the build's outcome is known to the request or to the task keeping its deadline.
    handle: Option<tokio::task::JoinHandle<Result<Option<Resolved>, Error>>>,
    /// Released by whichever ends first: the build, or the request at the deadline.
    held: Arc<Mutex<Option<Held>>>,
    state: Arc<Mutex<BuildState>>,
    probe: Arc<BuildProbe>,
    started: Instant,
    dataset: String,
    video: String,
    /// A lookup (no build): worded so in a refusal past the deadline.
    lookup: bool,
}

impl Build {
    /// Past the deadline: the permit or place is released, the file is remembered as stalled, and the
    /// thread is left to return on its own. Returns the request's message.
    fn abandon(&self) -> String {
        let cat = &self.catalog;
        self.held.lock().take();
        {
            let mut state = self.state.lock();
            if *state == BuildState::Running {
                *state = BuildState::Abandoned;
                cat.stuck_builds.fetch_add(1, Ordering::Relaxed);
            }
        }
        let msg = format!(
            "{} video {:?} in dataset {:?} took longer than the {} s deadline (--index-deadline): its read or decoder is stuck (a hung network file system, a FIFO, a pathological file); it is not tried again for {} s unless it changes",
            if self.lookup { "opening" } else { "indexing" },
            self.video,
            self.dataset,
            cat.index_deadline.as_secs_f64(),
            STALLED_FOR.as_secs()
        );
        cat.index_stalled(self.probe.key.get().cloned(), &msg);
        if let Some(j) = self.probe.journal.lock().as_ref() {
            // A stall, not a crash: not quarantined should the daemon die later.
            j.mark_stalled();
        }
        tracing::error!(dataset = %self.dataset, video = %self.video, lookup = self.lookup, deadline_s = cat.index_deadline.as_secs_f64(), "index build past its deadline; request failed, thread abandoned");
        msg
    }
}

impl Drop for Build {
    /// The request went away before the build ended: a task keeps the build's deadline.
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        if handle.is_finished() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let deadline = tokio::time::Instant::from_std(self.started + self.catalog.index_deadline);
        let keeper = Build {
            catalog: self.catalog.clone(),
            handle: None,
            held: self.held.clone(),
            state: self.state.clone(),
            probe: self.probe.clone(),
            started: self.started,
            dataset: std::mem::take(&mut self.dataset),
            video: std::mem::take(&mut self.video),
            lookup: self.lookup,
        };
        rt.spawn(async move {
            if tokio::time::timeout_at(deadline, handle).await.is_err() {
                keeper.abandon();
            }
        });
    }
}

impl Catalog {
    /// Resolves and indexes one video for `who`, as the module comment says.
    pub async fn resolve(
        self: &Arc<Self>,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
        who: &PeerKey,
    ) -> Result<Resolved, Error> {
        let building = match self.look_up(dataset, video, stream).await? {
            Ok(found) => return Ok(found),
            Err(building) => building,
        };
        if let Some((mut done, key)) = building {
            // Another request builds this table: wait for it without a place (holding one would keep
            // other clients' builds waiting behind a build that is already running), then look again.
            if tokio::time::timeout(self.index_deadline, done.changed())
                .await
                .is_err()
            {
                let msg = format!(
                    "video {video:?} in dataset {dataset:?} was being indexed for another request for longer than the {} s deadline (--index-deadline): its read or decoder is stuck; it is not tried again for {} s unless it changes",
                    self.index_deadline.as_secs_f64(),
                    STALLED_FOR.as_secs()
                );
                // The build has run at least the deadline: the file is stalled, as its own request
                // would have marked it. A build with no request of its own (a stream's build ahead)
                // marks nothing, and every request joining it waited the whole deadline again.
                self.index_stalled(key, &msg);
                tracing::error!(dataset, video, deadline_s = self.index_deadline.as_secs_f64(), "waited past the deadline for another request's index build; the file is refused as stalled");
                return Err(Error::DeadlineExceeded(msg));
            }
            if let Ok(found) = self.look_up(dataset, video, stream).await? {
                return Ok(found);
            }
        }
        let place = self
            .build_places
            .acquire(who)
            .await
            .ok_or(Error::ShuttingDown)?;
        let build = self.spawn_build(Held::Build(place), dataset, video, stream);
        self.finish(build)
            .await?
            .ok_or_else(|| Error::Internal(format!("index build of {video:?} returned no table")))
    }

    /// A lookup on a blocking thread: the video resolved when its table is cached or stored, else
    /// whether another request is building it (a receiver that sees that build end).
    async fn look_up(
        self: &Arc<Self>,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
    ) -> Result<Result<Resolved, Option<(tokio::sync::watch::Receiver<()>, Option<FileKey>)>>, Error>
    {
        let permit = self
            .lookups
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::ShuttingDown)?;
        let lookup = self.spawn_build(Held::Lookup(permit), dataset, video, stream);
        let probe = lookup.probe.clone();
        Ok(match self.finish(lookup).await? {
            Some(found) => Ok(found),
            None => Err(probe
                .in_progress
                .lock()
                .take()
                .map(|done| (done, probe.key.get().cloned()))),
        })
    }

    /// Resolves and indexes several videos in parallel for `who`, in order.
    pub async fn resolve_all(
        self: &Arc<Self>,
        dataset: &str,
        videos: &[(String, Option<u32>)],
        who: &PeerKey,
    ) -> Result<Vec<Resolved>, Error> {
        let timer = Timer::start();
        let out = futures::future::try_join_all(
            videos
                .iter()
                .map(|(video, stream)| self.resolve(dataset, video, *stream, who)),
        )
        .await?;
        timer.observe(&self.metrics.index);
        Ok(out)
    }

    /// Resolves and indexes one video on the calling (blocking) thread, outside the index places: the
    /// builds a stream runs ahead of its fill, on its own low-priority threads.
    pub fn index_ahead(&self, dataset: &str, video: &str) -> Result<(), Error> {
        self.resolve_blocking(dataset, video, None, &BuildProbe::default(), true)
            .map(|_| ())
    }

    /// A request failed for passing `--index-deadline` on the file `key` (when known): counted, and
    /// the file refused as stalled for [`STALLED_FOR`] unless it changes.
    fn index_stalled(&self, key: Option<FileKey>, msg: &str) {
        self.index_deadline_exceeded.fetch_add(1, Ordering::Relaxed);
        if let Some(k) = key {
            self.stalled.insert(k, (Instant::now(), msg.to_owned()));
        }
    }

    /// Index builds waiting for a place, and places free.
    pub fn builds_waiting(&self) -> (usize, usize) {
        self.build_places.waiting()
    }

    /// Starts a lookup (`held` a lookup permit) or a build (a build place) on a blocking thread,
    /// holding it until the work ends.
    fn spawn_build(
        self: &Arc<Self>,
        held: Held,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
    ) -> Build {
        let may_build = matches!(held, Held::Build(_));
        let held = Arc::new(Mutex::new(Some(held)));
        let state = Arc::new(Mutex::new(BuildState::Running));
        let probe = Arc::new(BuildProbe::default());
        let (this, d, v) = (self.clone(), dataset.to_owned(), video.to_owned());
        let (h, st, k) = (held.clone(), state.clone(), probe.clone());
        let handle = tokio::task::spawn_blocking(move || {
            let result = this.resolve_blocking(&d, &v, stream, &k, may_build);
            h.lock().take();
            let mut state = st.lock();
            if *state == BuildState::Abandoned {
                this.stuck_builds.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!(dataset = %d, video = %v, ok = result.is_ok(), "an index build abandoned past its deadline returned");
                if let (Ok(_), Some(k)) = (&result, k.key.get()) {
                    // It was slow, not stuck: the table is cached now, so the file is served again.
                    this.stalled.invalidate(k);
                }
            }
            *state = BuildState::Done;
            result
        });
        Build {
            catalog: self.clone(),
            handle: Some(handle),
            held,
            state,
            probe,
            started: Instant::now(),
            dataset: dataset.to_owned(),
            video: video.to_owned(),
            lookup: !may_build,
        }
    }

    /// Awaits a build until its deadline. Past it the request fails with DEADLINE_EXCEEDED and the
    /// build is abandoned ([`Build::abandon`]).
    async fn finish(&self, mut b: Build) -> Result<Option<Resolved>, Error> {
        let deadline = tokio::time::Instant::from_std(b.started + self.index_deadline);
        let handle = b.handle.as_mut().expect("a build awaited once");
        let outcome = tokio::time::timeout_at(deadline, handle).await;
        b.handle = None;
        match outcome {
            Ok(joined) => joined.map_err(|e| Error::Internal(format!("index task failed: {e}")))?,
            Err(_) => Err(Error::DeadlineExceeded(b.abandon())),
        }
    }

    /// [`Catalog::resolve`] as a sampler needs it: a damaged video's table stops before its first bad
    /// frame (decoding still uses the whole table), one with no good frame is refused.
    pub async fn resolve_for_sampling(
        self: &Arc<Self>,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
        who: &PeerKey,
    ) -> Result<Resolved, Error> {
        let (id, index, source) = self.resolve(dataset, video, stream, who).await?;
        let usable = match self.health.lock().get(&id.plain()) {
            Some(h) => h.decodable_frames(index.frame_count() as u64) as usize,
            None => return Ok((id, index, source)),
        };
        if usable >= index.frame_count() {
            return Ok((id, index, source));
        }
        if usable == 0 {
            return Err(Error::DataLoss(format!(
                "{video:?} has no frame that decodes without errors"
            )));
        }
        let mut view = (*index).clone();
        view.frames.truncate(usable);
        view.keyframes.keep_below(usable);
        Ok((id, Arc::new(view), source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A catalogue over copies of one video (`v0.mp4`..), with one decode thread (one build place).
    fn catalog(dir: &std::path::Path, copies: usize) -> Arc<Catalog> {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/media/torchcodec/nasa_13013.mp4");
        for i in 0..copies {
            std::fs::copy(&src, dir.join(format!("v{i}.mp4"))).unwrap();
        }
        let config = crate::cli::ServeArgs {
            dataset: vec![format!("d={}", dir.display())],
            decode_threads: Some(1),
            state_dir: Some("none".into()),
            ..Default::default()
        }
        .to_config()
        .unwrap();
        Arc::new(Catalog::open(&config, crate::metrics::EngineMetrics::default()).unwrap())
    }

    fn client(pid: i32) -> PeerKey {
        PeerKey::Process { pid, start: 1 }
    }

    /// A video indexed once is served while every build place is taken and builds wait; the builds
    /// that wait run in turns round the clients, not in the order they were asked for.
    #[tokio::test]
    async fn indexed_videos_wait_for_no_build_and_builds_take_turns_by_client() {
        let dir = tempfile::tempdir().unwrap();
        let cat = catalog(dir.path(), 4);
        let (_, indexed, _) = cat.resolve("d", "v0.mp4", None, &client(9)).await.unwrap();
        assert_eq!(cat.index_builds(), 1);

        // Client 1 holds the only place; it asks for two more videos, then client 2 for one.
        let held = cat.build_places.acquire(&client(1)).await.unwrap();
        let (tx, mut done) = tokio::sync::mpsc::unbounded_channel();
        let ask = |video: &'static str, who: i32| {
            let (cat, tx) = (cat.clone(), tx.clone());
            tokio::spawn(async move {
                let r = cat.resolve("d", video, None, &client(who)).await;
                tx.send((video, r.map(|(_, ix, _)| ix.frame_count())))
                    .unwrap();
            })
        };
        let mut asked = Vec::new();
        for (video, who) in [("v1.mp4", 1), ("v2.mp4", 1), ("v3.mp4", 2)] {
            asked.push(ask(video, who));
            while cat.builds_waiting().0 < asked.len() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        // The indexed video needs no place: it comes back while all three builds wait.
        let again = tokio::time::timeout(
            Duration::from_secs(30),
            cat.resolve("d", "v0.mp4", None, &client(2)),
        )
        .await
        .expect("an indexed video waited behind index builds")
        .unwrap();
        assert_eq!(again.1.frame_count(), indexed.frame_count());
        assert_eq!(cat.builds_waiting(), (3, 0));
        assert_eq!(cat.index_builds(), 1);

        drop(held);
        for t in asked {
            t.await.unwrap();
        }
        drop(tx);
        let mut order = Vec::new();
        while let Some((video, frames)) = done.recv().await {
            assert_eq!(frames.unwrap(), indexed.frame_count(), "{video}");
            order.push(video);
        }
        // One place: client 1's first, then client 2's, then client 1's second.
        assert_eq!(order, ["v1.mp4", "v3.mp4", "v2.mp4"]);
        assert_eq!(cat.index_builds(), 4);
        assert_eq!(cat.builds_waiting(), (0, 1));
    }

    /// A request for a table another request is building waits for that build without taking a place,
    /// and gets the table it made.
    #[tokio::test]
    async fn a_table_being_built_is_waited_for_without_a_place() {
        let dir = tempfile::tempdir().unwrap();
        let cat = catalog(dir.path(), 1);
        let (id, index, _) = cat.resolve("d", "v0.mp4", None, &client(1)).await.unwrap();
        cat.indexes.invalidate(&id);
        // v0's table is being built (as for another request), and the only place is held.
        let building = Building::enter(&cat.building, &id);
        let held = cat.build_places.acquire(&client(1)).await.unwrap();
        let waiter = tokio::spawn({
            let cat = cat.clone();
            async move {
                cat.resolve("d", "v0.mp4", None, &client(2))
                    .await
                    .map(|(_, ix, _)| ix.frame_count())
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished());
        assert_eq!(cat.builds_waiting(), (0, 0), "it waits for a place");
        // The build ends with the table cached: the waiter has it, no place taken, nothing built again.
        cat.indexes.insert(id.clone(), index.clone());
        drop(building);
        let frames = tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("the waiter saw the build end")
            .unwrap()
            .unwrap();
        assert_eq!(frames, index.frame_count());
        assert_eq!(cat.index_builds(), 1);
        drop(held);
    }
}
