//! The catalogue: the datasets served, their sample lists (manifests, gulp sets, and the last complete
//! walk of each directory root, `listing.rs`), and every video's frame table, cached by file identity
//! (packed, or mapped from the store), with the memory of files that failed to index or turned out
//! damaged.
//!
//! Input: a dataset name and a video path (or gulp id). Output: the video's identity ([`VideoId`], the
//! cache key), its [`VideoIndex`] and the [`VideoSource`] a decode job needs ([`Catalog::resolve`]).
//!
//! Invariants: a path is resolved inside its dataset's root and opened beneath it once
//! ([`Dataset::open`]); the index build and every decode read that descriptor, never the path again.
//! A lookup first finds tables already cached or stored; index builds run on blocking threads, at most
//! one per decode thread at a time, the places going round the waiting clients (`builds.rs`), each
//! within the index deadline: past it the request fails with DEADLINE_EXCEEDED and the permit is released (the stuck
//! thread is left to finish on its own). A failed file is not scanned again for 30 s unless it changes
//! (identity includes size and mtime); a stalled one (index or decode past its deadline) for 5 minutes;
//! a quarantined one (it crashed a daemon, [`crate::journal`]) never, until it changes: DATA_LOSS. A file
//! found damaged is indexed by decoding from then on. Index builds record their file in the crash journal
//! before opening it. With a [`Store`], a table is looked up there before it is built and written there after,
//! with the video's health: a restart re-indexes nothing unchanged, a damaged file stays damaged, and
//! [`Catalog::resolve_for_sampling`] narrows a damaged video to the frames before its first bad one and
//! refuses unreadable and quarantined ones.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::cache::VideoId;
use crate::config::Config;
use crate::dataset::Dataset;
use crate::decode::VideoSource;
use crate::error::Error;
use crate::gulp::reader::{GulpDataset, GulpVideo};
use crate::index::{IndexError, VideoIndex};
use crate::journal::{FileKey, Journal, Quarantine};
use crate::manifest::Samples;
use crate::metrics::EngineMetrics;
use crate::store::{Health, Key, Record, Store};

mod builds;
mod gate;
mod listing;
use builds::BuildProbe;
use gate::Gate;
use listing::Listings;
pub use listing::Reloaded;

/// An index build that takes at least this long is logged (WARN) when it ends.
const SLOW_INDEX_SECONDS: f64 = 10.0;

/// A resolved, indexed video.
pub type Resolved = (Arc<VideoId>, Arc<VideoIndex>, VideoSource);

/// How long a file that stalled (index build or decode run past its deadline) is refused.
pub const STALLED_FOR: Duration = Duration::from_secs(300);

/// Stream indices a request may name: far more than any container holds, and clear of the store's
/// "best stream" marker (`u32::MAX`), which a named stream must never alias.
pub const MAX_STREAM_INDEX: u32 = 1 << 16;

pub struct Catalog {
    datasets: BTreeMap<String, Dataset>,
    /// Datasets whose root holds GulpIO chunks: videos are ids, frames stored JPEGs.
    gulps: BTreeMap<String, Arc<GulpDataset>>,
    indexes: moka::sync::Cache<Arc<VideoId>, Arc<VideoIndex>>,
    /// Files that failed to index, remembered briefly (by identity, so a replaced file is tried again at
    /// once): a client repeating a request for a broken file costs a lookup, not another scan.
    failed: moka::sync::Cache<Arc<VideoId>, IndexError>,
    /// Files whose coded data turned out damaged (by [`VideoId::plain`]): they are indexed
    /// by decoding from then on.
    damaged: Mutex<HashSet<VideoId>>,
    /// Every dataset's sample list (manifest, gulp set, or the last walk of its root) and video count:
    /// built in the background at start, refreshed on reload, swapped whole ([`listing`]).
    listings: Listings,
    /// Bounds concurrent index builds (file scans, and full decodes for irregular files) to the decode
    /// thread count, so a batch of new videos cannot oversubscribe the cores from the blocking pool;
    /// places go round the waiting clients (`gate.rs`).
    build_places: Arc<Gate>,
    /// Bounds the videos CheckDataset calls decode at once, all calls together, to the decode thread
    /// count, places going round the clients as for builds (`handle/check.rs`).
    check_places: Arc<Gate>,
    /// Bounds concurrent lookups (a file open and a cache or store read, `builds.rs`).
    lookups: Arc<tokio::sync::Semaphore>,
    index_builds: AtomicU64,
    metrics: EngineMetrics,
    /// How long one index build may take before its request fails (`--index-deadline`).
    index_deadline: Duration,
    /// Index builds abandoned past their deadline whose threads have not returned, and how many of
    /// those make the catalogue unhealthy (more than the decode threads).
    stuck_builds: AtomicUsize,
    max_stuck_builds: usize,
    index_deadline_exceeded: AtomicU64,
    /// Files whose index build or decode run stalled past its deadline: (when, why).
    stalled: moka::sync::Cache<FileKey, (Instant, String)>,
    /// Files that crashed a daemon: refused until they change.
    quarantine: Arc<Quarantine>,
    /// Where index builds record the file they open (None: no state directory).
    journal: Option<Arc<Journal>>,
    /// Frame tables and health remembered across restarts (the state directory's); None without one.
    store: Option<Arc<Store>>,
    /// Videos known not to decode whole (damaged, unreadable, quarantined), by [`VideoId::plain`]: what
    /// [`Catalog::resolve_for_sampling`] consults.
    health: Mutex<HashMap<VideoId, Health>>,
    /// Tables being built now, each with a receiver that sees its build end (its sender dropped): a
    /// lookup that finds one waits for it without a place (`builds.rs`).
    building: builds::UnderWay,
    /// Every dataset root as messages quote a path beneath it (`"/srv/kin/`), longest first: what
    /// [`Catalog::client_message`] takes out.
    quoted_roots: Vec<String>,
}

/// What one cached frame table costs beyond its own columns ([`VideoIndex::approx_bytes`]): its key's
/// path, the table's and key's structs, the cache's bookkeeping per entry and the allocator's rounding.
/// Weighed by its columns alone, an 8x10 VP9 clip's table counted about 690 bytes while the daemon's RSS
/// grew 1.6 KB per table, so the 256 MiB index cache held over 600 MB (probe E: 784 MiB of RSS at 400k
/// videos with a 1 MiB frame cache). Now it weighs 1.64 KB; with a 16 MiB index cache the daemon's RSS
/// stayed within 10 MiB over 50,000 more tables built and evicted (docs/BENCHMARKS.md, run s49).
pub const INDEX_ENTRY_BYTES: usize = 900;

/// A cached frame table's weight against `--index-cache-bytes`.
fn index_weight(key: &VideoId, index: &VideoIndex) -> usize {
    index.approx_bytes() + key.path.as_os_str().len() + INDEX_ENTRY_BYTES
}

impl Catalog {
    /// Opens every configured dataset (gulp chunks and manifests are read now).
    pub fn open(config: &Config, metrics: EngineMetrics) -> Result<Catalog, String> {
        let mut datasets = BTreeMap::new();
        let mut manifests = BTreeMap::new();
        let mut gulps = BTreeMap::new();
        for d in &config.datasets {
            let ds = Dataset::new(&d.name, &d.root)
                .map_err(|e| format!("dataset {:?}: root {:?}: {e}", d.name, d.root))?;
            if let Some(given) = ds.given_through_symlink() {
                tracing::warn!(dataset = %d.name, root = %given.display(), serving = %ds.root.display(), "the dataset root is reached through a symlink: the directory it leads to now is served until the daemon restarts (a reload reports it when the symlink leads elsewhere)");
            }
            if crate::gulp::is_gulp_dir(&ds.root) {
                let g = GulpDataset::open(&ds.root)
                    .map_err(|e| format!("dataset {:?}: {e}", d.name))?
                    .with_max_pixels(crate::decode::ffmpeg::open::max_pixels());
                tracing::info!(dataset = %d.name, videos = g.len(), unreadable_chunks = g.broken.len(), "gulp dataset opened");
                if d.manifest.is_none() {
                    let samples = g
                        .samples()
                        .map_err(|e| format!("dataset {:?}: {e}", d.name))?;
                    manifests.insert(d.name.clone(), Arc::new(samples));
                }
                gulps.insert(d.name.clone(), Arc::new(g));
            }
            datasets.insert(d.name.clone(), ds);
            if let Some(m) = &d.manifest {
                let samples =
                    Samples::from_manifest(m).map_err(|e| format!("dataset {:?}: {e}", d.name))?;
                tracing::info!(dataset = %d.name, manifest = %m.display(), samples = samples.len(), "manifest loaded");
                if let Some(w) = samples.warning() {
                    tracing::warn!(dataset = %d.name, manifest = %m.display(), "{w}");
                }
                manifests.insert(d.name.clone(), Arc::new(samples));
            }
        }
        let listings = Listings::new(
            manifests,
            config
                .datasets
                .iter()
                .filter_map(|d| Some((d.name.clone(), d.manifest.clone()?)))
                .collect(),
            datasets
                .keys()
                .filter(|n| !gulps.contains_key(*n))
                .cloned()
                .collect(),
        );
        let mut quoted_roots: Vec<String> = datasets
            .values()
            .map(|d| &d.root)
            .chain(gulps.values().map(|g| &g.root))
            .map(|root| crate::dataset::quoted_root(root))
            .collect();
        quoted_roots.sort_by_key(|q| std::cmp::Reverse(q.len()));
        quoted_roots.dedup();
        Ok(Catalog {
            quoted_roots,
            datasets,
            gulps,
            indexes: moka::sync::Cache::builder()
                .max_capacity(config.cache.index_bytes)
                .weigher(|k: &Arc<VideoId>, v: &Arc<VideoIndex>| {
                    u32::try_from(index_weight(k, v)).unwrap_or(u32::MAX)
                })
                .build(),
            failed: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(std::time::Duration::from_secs(30))
                .build(),
            damaged: Mutex::new(HashSet::new()),
            listings,
            build_places: Gate::new(config.decode.threads.max(1)),
            check_places: Gate::new(config.decode.threads.max(1)),
            lookups: Arc::new(tokio::sync::Semaphore::new(
                config.decode.threads.max(1) * builds::LOOKUPS_PER_THREAD,
            )),
            index_builds: AtomicU64::new(0),
            metrics,
            index_deadline: config.decode.index_deadline,
            stuck_builds: AtomicUsize::new(0),
            max_stuck_builds: config.decode.threads.max(1),
            index_deadline_exceeded: AtomicU64::new(0),
            stalled: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(STALLED_FOR)
                .build(),
            quarantine: Arc::new(Quarantine::in_memory()),
            journal: None,
            store: None,
            health: Mutex::new(HashMap::new()),
            building: Mutex::new(HashMap::new()),
        })
    }

    /// Remembers frame tables and health in `store` (and consults it before indexing).
    pub fn with_store(mut self, store: Option<Arc<Store>>) -> Catalog {
        self.store = store;
        self
    }

    /// A place to decode one video of a CheckDataset call for `who` (see `check_places`).
    pub async fn check_place(&self, who: &crate::peer::PeerKey) -> Option<gate::Place> {
        self.check_places.acquire(who).await
    }

    /// CheckDataset videos waiting for a check place.
    pub fn checks_waiting(&self) -> usize {
        self.check_places.waiting().0
    }

    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// Gives the catalogue the crash journal its index builds record in and the quarantine it refuses
    /// (both from [`crate::journal::recover`]).
    pub fn set_crash_guard(&mut self, journal: Option<Arc<Journal>>, quarantine: Arc<Quarantine>) {
        self.journal = journal;
        self.quarantine = quarantine;
    }

    /// Files in quarantine.
    pub fn quarantined(&self) -> usize {
        self.quarantine.len()
    }

    /// The quarantine this catalogue refuses files from (listed and cleared by the Quarantine RPC).
    pub fn quarantine(&self) -> &Arc<Quarantine> {
        &self.quarantine
    }

    /// Index builds abandoned past their deadline and still stuck, and those that passed it in all.
    pub fn stuck_builds(&self) -> (u64, u64) {
        (
            self.stuck_builds.load(Ordering::Relaxed) as u64,
            self.index_deadline_exceeded.load(Ordering::Relaxed),
        )
    }

    /// Err when more index builds are stuck than there are decode threads (the blocking pool is
    /// filling with threads that will not return).
    pub fn health(&self) -> Result<(), String> {
        let stuck = self.stuck_builds.load(Ordering::Relaxed);
        if stuck > self.max_stuck_builds {
            return Err(format!(
                "{stuck} index builds are stuck past the {} s deadline (more than {})",
                self.index_deadline.as_secs_f64(),
                self.max_stuck_builds
            ));
        }
        Ok(())
    }

    /// Remembers that a decode run of `id`'s file went past its deadline: the file is refused for
    /// [`STALLED_FOR`] unless it changes.
    pub fn mark_stalled(&self, id: &VideoId, detail: &str) {
        let key = FileKey {
            path: id.path.clone(),
            size: id.size,
            mtime_ns: id.mtime_ns,
        };
        self.stalled
            .insert(key, (Instant::now(), detail.to_owned()));
    }

    /// How long one video's index build may take (`--index-deadline`).
    pub fn index_deadline(&self) -> Duration {
        self.index_deadline
    }

    /// Frame tables in the index cache, and their weight ([`index_weight`]) against
    /// `--index-cache-bytes`.
    pub fn index_cache(&self) -> (u64, u64) {
        self.indexes.run_pending_tasks();
        (self.indexes.entry_count(), self.indexes.weighted_size())
    }

    /// Video indexes built since start-up.
    pub fn index_builds(&self) -> u64 {
        self.index_builds.load(Ordering::Relaxed)
    }

    /// `msg` as clients see it: a video's path beneath a dataset root written as clients name it, relative
    /// to the root (`"/srv/kin/a/b.mp4"` becomes `"a/b.mp4"`). A remote client has no business learning
    /// the server's directories; the daemon's own log keeps the whole path.
    pub fn client_message(&self, msg: &str) -> Option<String> {
        let found = self
            .quoted_roots
            .iter()
            .filter(|q| msg.contains(q.as_str()));
        let mut out: Option<String> = None;
        for q in found {
            out = Some(out.as_deref().unwrap_or(msg).replace(q.as_str(), "\""));
        }
        out
    }

    pub fn dataset(&self, name: &str) -> Result<&Dataset, Error> {
        self.datasets
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("dataset {name:?} not served here")))
    }

    /// Records that a video's coded data is damaged, so its next index comes from a decode.
    pub fn mark_damaged(&self, id: &VideoId, detail: &str) {
        if self.damaged.lock().insert(id.plain()) {
            self.metrics.damaged_files.inc();
            tracing::warn!(path = %id.path.display(), %detail, "decoding disagreed with the packet scan of a file that scanned clean (damage inside its coded data, or timestamps out of the order of its pictures, as at the joins of some concatenated files); indexing it by decoding");
        }
    }

    /// Resolves and indexes one video. Blocking (FFmpeg); call from a blocking thread. `probe` gets the
    /// file's identity as soon as it is opened, and the journal slot of its index build (for the
    /// deadline's bookkeeping). Without `may_build`, a video whose table is neither cached nor stored is
    /// `Ok(None)` (a lookup, `builds.rs`).
    fn resolve_blocking(
        &self,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
        probe: &BuildProbe,
        may_build: bool,
    ) -> Result<Option<Resolved>, Error> {
        if let Some(s) = stream.filter(|&s| s >= MAX_STREAM_INDEX) {
            return Err(Error::InvalidArgument(format!(
                "stream {s} of {video:?} does not exist: stream indices are below {MAX_STREAM_INDEX}"
            )));
        }
        let ds = self.dataset(dataset)?;
        if let Some(g) = self.gulps.get(dataset) {
            return self.index_stored(g, video).map(Some);
        }
        let file = Arc::new(ds.open(video)?);
        let key = FileKey::of(&file);
        let _ = probe.key.set(key.clone());
        if let Some(q) = self.quarantine.check(&key) {
            return Err(Error::DataLoss(format!(
                "video {video:?} in dataset {dataset:?} is quarantined: {} ({} s ago); it is served again once the file changes (new size or mtime), or once `vserve quarantine clear --path P` removes its entry from {} (P the path `vserve quarantine list` prints for it, on the daemon's host)",
                q.why,
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
                    .saturating_sub(q.since),
                self.quarantine.location()
            )));
        }
        if let Some((when, detail)) = self.stalled.get(&key) {
            return Err(Error::DeadlineExceeded(format!(
                "video {video:?} in dataset {dataset:?} stalled {} s ago and is not tried again for {} s unless it changes: {detail}",
                when.elapsed().as_secs(),
                STALLED_FOR.as_secs()
            )));
        }
        let path = file.path.clone();
        let mut id = VideoId {
            path: path.clone(),
            size: file.size,
            mtime_ns: file.mtime_ns,
            stream,
            node: file.node,
            decode_table: false,
        };
        id.decode_table = self.damaged.lock().contains(&id.plain());
        if let Some(e) = self.failed.get(&id) {
            return Err(e.into());
        }
        let stored = self.recall(&mut id, &file);
        if let Some(e) = self.refusal(&id) {
            return Err(e);
        }
        let id = Arc::new(id);
        // A lookup reads the cache and never builds, even when the table is evicted meanwhile.
        let cached = match (may_build, &stored) {
            (false, None) => match self.indexes.get(&id) {
                Some(index) => Some(index),
                None => {
                    *probe.in_progress.lock() = self.building.lock().get(&id).cloned();
                    return Ok(None);
                }
            },
            _ => None,
        };
        let force_decode = id.decode_table;
        let index = match cached {
            Some(index) => index,
            None => self.build_or_cached(&id, &file, stored, force_decode, probe)?,
        };
        let source = VideoSource {
            path,
            index: index.clone(),
            gulp: None,
            file: Some(file),
        };
        Ok(Some((id, index, source)))
    }

    /// `id`'s table from the cache, else from `stored`, else built now (one build per table however many
    /// ask at once).
    fn build_or_cached(
        &self,
        id: &Arc<VideoId>,
        file: &Arc<crate::dataset::CheckedFile>,
        mut stored: Option<Arc<VideoIndex>>,
        force_decode: bool,
        probe: &BuildProbe,
    ) -> Result<Arc<VideoIndex>, Error> {
        let (path, key, stream) = (&file.path, FileKey::of(file), id.stream);
        self.indexes
            .try_get_with(id.clone(), || {
                if let Some(table) = stored.take() {
                    return Ok(table);
                }
                self.index_builds.fetch_add(1, Ordering::Relaxed);
                let _building = builds::Building::enter(&self.building, id);
                let started = std::time::Instant::now();
                // Recorded before FFmpeg opens the file; cleared when the build returns.
                let journal = self.journal.as_ref().and_then(|j| {
                    let slot = j
                        .slot()
                        .and_then(|s| s.enter(&key, false).map(|()| Arc::new(s)));
                    slot.map_err(|e| crate::journal::warn_unrecorded(path, &e))
                        .ok()
                });
                *probe.journal.lock() = journal.clone();
                let built = crate::decode::ffmpeg::build_index_of(
                    file,
                    stream.map(|s| s as usize),
                    force_decode,
                );
                if let Some(j) = journal {
                    j.leave();
                }
                let (seconds, ok) = (started.elapsed().as_secs_f64(), built.is_ok());
                let frames = built.as_ref().map_or(0, |ix| ix.frame_count());
                if seconds >= SLOW_INDEX_SECONDS {
                    // It held an index slot (and a core) that long, whoever still waited for it.
                    tracing::warn!(path = %path.display(), frames, ok, seconds, "slow index build");
                } else if ok {
                    tracing::debug!(path = %path.display(), frames, seconds, "indexed");
                }
                // Held packed (the record's columns, read in place): a few hundred bytes a table.
                let built = built.map(|ix| Arc::new(crate::store::format::pack(ix)));
                self.remember(id, file, &built);
                built
            })
            .map_err(|e| {
                self.metrics.index_failures.inc();
                self.failed.insert(id.clone(), (*e).clone());
                Error::from((*e).clone())
            })
    }

    /// The stored table for `id` when the index cache lacks it, learning the video's health on the way
    /// (a record of a damaged file switches `id` to its decode table).
    fn recall(
        &self,
        id: &mut VideoId,
        file: &crate::dataset::CheckedFile,
    ) -> Option<Arc<VideoIndex>> {
        let store = self.store.as_ref()?;
        if self.indexes.contains_key(id) {
            return None;
        }
        let record = store.get(&key_of(id))?;
        if !record.made_from(file) {
            // Another file took the path with the same size and mtime: what was learned of the old one
            // (its damage, its health) is not this one's. The build that follows replaces the record.
            let plain = id.plain();
            self.damaged.lock().remove(&plain);
            self.health.lock().remove(&plain);
            id.decode_table = false;
            return None;
        }
        self.learn(&record);
        id.decode_table |= record.decode_table;
        record
            .table
            .filter(|_| record.decode_table == id.decode_table)
    }

    /// Takes in what a record says about a video (from the store, or a check just run).
    pub fn learn(&self, record: &Record) {
        let k = &record.key;
        let plain = VideoId {
            path: k.path.clone(),
            size: k.size,
            mtime_ns: k.mtime_ns,
            stream: k.stream,
            node: Default::default(),
            decode_table: false,
        };
        if record.decode_table {
            self.damaged.lock().insert(plain.clone());
        }
        match &record.health {
            Health::Unchecked | Health::Ok { .. } => self.health.lock().remove(&plain),
            h => self.health.lock().insert(plain, h.clone()),
        };
    }

    /// Stores a build's outcome; a table that met decoder errors is decoded whole once more to find where
    /// the damage starts.
    fn remember(
        &self,
        id: &VideoId,
        file: &crate::dataset::CheckedFile,
        built: &Result<Arc<VideoIndex>, IndexError>,
    ) {
        let Some(store) = &self.store else { return };
        let (health, table) = match built {
            Ok(ix) if ix.needs_health_check() => {
                (crate::check::health_of(file, id.stream), Some(ix.clone()))
            }
            Ok(ix) => (Health::Unchecked, Some(ix.clone())),
            Err(IndexError::Corrupt { reason, .. }) => (
                Health::Unreadable {
                    reason: reason.clone(),
                    corrupt: true,
                },
                None,
            ),
            // A named stream that is not a video says nothing about the file, and remembering it let one
            // client fill the store (evicting real tables) and the health map, a record per number.
            Err(IndexError::NoVideo { .. }) if id.stream.is_some() => return,
            Err(e @ IndexError::NoVideo { .. }) => (
                Health::Unreadable {
                    reason: e.to_string(),
                    corrupt: false,
                },
                None,
            ),
            // Opening can fail for passing reasons (permissions, descriptors), and a file over this
            // daemon's pixel bound is one another configuration decodes: not remembered.
            Err(IndexError::Open { .. } | IndexError::TooLarge { .. }) => return,
        };
        let record = Record {
            key: key_of(id),
            health,
            decode_table: id.decode_table,
            table,
            written_ms: 0,
            content: file.content_sample(),
            node: file.node,
        };
        self.learn(&record);
        if let Err(e) = store.put(&record) {
            tracing::warn!(path = %id.path.display(), error = %e, "cannot write the store");
        }
    }

    /// The error for a video the store knows not to open (unreadable, quarantined).
    fn refusal(&self, id: &VideoId) -> Option<Error> {
        let plain = id.plain();
        let health = self.health.lock();
        let msg = |what: &str, reason: &str| format!("{:?} is {what}: {reason}", id.path.display());
        match health.get(&plain)? {
            Health::Unreadable { reason, corrupt } if *corrupt => {
                Some(Error::DataLoss(msg("unreadable", reason)))
            }
            Health::Unreadable { reason, .. } => {
                Some(Error::InvalidArgument(msg("unreadable", reason)))
            }
            Health::Quarantined { reason } => Some(Error::DataLoss(msg(
                "quarantined (it crashed the daemon)",
                reason,
            ))),
            _ => None,
        }
    }

    /// A video of a gulp dataset, by id: its table comes from the meta file, its identity (cache key) is
    /// its chunk's data file plus the id.
    fn index_stored(&self, g: &Arc<GulpDataset>, video: &str) -> Result<Resolved, Error> {
        let (data_path, size, mtime_ns) = g.identity(video)?;
        let id = Arc::new(VideoId {
            // Only a cache key (never opened): the chunk's data file and the id.
            path: std::path::PathBuf::from(format!("{}#{video}", data_path.display())),
            size,
            mtime_ns,
            stream: None,
            node: Default::default(),
            decode_table: false,
        });
        let index = self
            .indexes
            .try_get_with(id.clone(), || {
                g.index(video)
                    .map(|ix| Arc::new(crate::store::format::pack(ix)))
            })
            .map_err(|e| Error::from((*e).clone()))?;
        let source = VideoSource {
            path: id.path.clone(),
            index: index.clone(),
            gulp: Some(GulpVideo {
                dataset: g.clone(),
                id: video.into(),
            }),
            file: None,
        };
        Ok((id, index, source))
    }
}

/// The store's key for a catalogue identity.
fn key_of(id: &VideoId) -> Key {
    Key {
        path: id.path.clone(),
        size: id.size,
        mtime_ns: id.mtime_ns,
        stream: id.stream,
    }
}
