//! The catalogue: the datasets served, their sample lists (manifests, gulp sets, recent directory
//! scans), and every video's frame table, cached by file identity, with the memory of files that failed
//! to index or turned out damaged.
//!
//! Input: a dataset name and a video path (or gulp id). Output: the video's identity ([`VideoId`], the
//! cache key), its [`VideoIndex`] and the [`VideoSource`] a decode job needs ([`Catalog::resolve`]).
//!
//! Invariants: a path is resolved inside its dataset's root before anything opens it; index builds run
//! on blocking threads, at most one per decode thread at a time; a failed file is not scanned again for
//! 30 s unless it changes (identity includes size and mtime); a file found damaged is indexed by decoding
//! from then on. With a [`Store`], a table is looked up there before it is built and written there after,
//! with the video's health: a restart re-indexes nothing unchanged, a damaged file stays damaged, and
//! [`Catalog::resolve_for_sampling`] narrows a damaged video to the frames before its first bad one and
//! refuses unreadable and quarantined ones.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::cache::VideoId;
use crate::config::Config;
use crate::dataset::Dataset;
use crate::decode::VideoSource;
use crate::error::{blocking, Error};
use crate::gulp::reader::{GulpDataset, GulpVideo};
use crate::index::{IndexError, VideoIndex};
use crate::manifest::Samples;
use crate::metrics::{EngineMetrics, Timer};
use crate::request::DatasetSummary;
use crate::store::{Health, Key, Record, Store};

/// A resolved, indexed video.
pub type Resolved = (Arc<VideoId>, Arc<VideoIndex>, VideoSource);

/// One walk of a directory dataset.
#[derive(Clone)]
struct Listing {
    /// The videos found, as samples (unused for datasets with a manifest).
    samples: Arc<Samples>,
    videos: u64,
}

pub struct Catalog {
    datasets: BTreeMap<String, Dataset>,
    /// Datasets whose root holds GulpIO chunks: videos are ids, frames stored JPEGs.
    gulps: BTreeMap<String, Arc<GulpDataset>>,
    /// Parsed manifests and gulp sample lists, by dataset name (datasets without one are scanned per
    /// stream, see `recent_scans`).
    manifests: BTreeMap<String, Arc<Samples>>,
    indexes: moka::sync::Cache<Arc<VideoId>, Arc<VideoIndex>>,
    /// Files that failed to index, remembered briefly (by identity, so a replaced file is tried again at
    /// once): a client repeating a request for a broken file costs a lookup, not another scan.
    failed: moka::sync::Cache<Arc<VideoId>, IndexError>,
    /// Files whose coded data turned out damaged (by identity without `decode_table`): they are indexed
    /// by decoding from then on.
    damaged: Mutex<HashSet<VideoId>>,
    /// What the last walk of each directory dataset found: its samples (for datasets without a
    /// manifest) and video count. Built in the background at start, refreshed every `--rescan-interval`
    /// and on SIGHUP, swapped whole; streams and ListDatasets read it and never walk.
    listings: parking_lot::RwLock<BTreeMap<String, Listing>>,
    /// One walk at a time (a stream opening before the first walk finished waits for it).
    walking: Mutex<()>,
    /// Bounds concurrent index builds (file scans, and full decodes for irregular files) to the decode
    /// thread count, so a batch of new videos cannot oversubscribe the cores from the blocking pool.
    index_permits: Arc<tokio::sync::Semaphore>,
    index_builds: AtomicU64,
    metrics: EngineMetrics,
    /// Frame tables and health remembered across restarts (the state directory's); None without one.
    store: Option<Arc<Store>>,
    /// Videos known not to decode whole (damaged, unreadable, quarantined), by identity without
    /// `decode_table`: what [`Catalog::resolve_for_sampling`] consults.
    health: Mutex<HashMap<VideoId, Health>>,
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
            if crate::gulp::is_gulp_dir(&ds.root) {
                let g = GulpDataset::open(&ds.root)
                    .map_err(|e| format!("dataset {:?}: {e}", d.name))?;
                tracing::info!(dataset = %d.name, videos = g.len(), unreadable_chunks = g.broken.len(), "gulp dataset opened");
                if d.manifest.is_none() {
                    manifests.insert(d.name.clone(), Arc::new(g.samples()));
                }
                gulps.insert(d.name.clone(), Arc::new(g));
            }
            datasets.insert(d.name.clone(), ds);
            if let Some(m) = &d.manifest {
                let samples =
                    Samples::from_manifest(m).map_err(|e| format!("dataset {:?}: {e}", d.name))?;
                tracing::info!(dataset = %d.name, manifest = %m.display(), samples = samples.len(), "manifest loaded");
                manifests.insert(d.name.clone(), Arc::new(samples));
            }
        }
        Ok(Catalog {
            datasets,
            gulps,
            manifests,
            indexes: moka::sync::Cache::builder()
                .max_capacity(config.cache.index_bytes)
                .weigher(|_k: &Arc<VideoId>, v: &Arc<VideoIndex>| {
                    u32::try_from(v.approx_bytes()).unwrap_or(u32::MAX)
                })
                .build(),
            failed: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(std::time::Duration::from_secs(30))
                .build(),
            damaged: Mutex::new(HashSet::new()),
            listings: parking_lot::RwLock::new(BTreeMap::new()),
            walking: Mutex::new(()),
            index_permits: Arc::new(tokio::sync::Semaphore::new(config.decode.threads.max(1))),
            index_builds: AtomicU64::new(0),
            metrics,
            store: None,
            health: Mutex::new(HashMap::new()),
        })
    }

    /// Remembers frame tables and health in `store` (and consults it before indexing).
    pub fn with_store(mut self, store: Option<Arc<Store>>) -> Catalog {
        self.store = store;
        self
    }

    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// The datasets served, from the catalogue (a dataset not walked yet is walked now, once).
    pub fn datasets(&self) -> Vec<DatasetSummary> {
        self.datasets
            .values()
            .map(|d| {
                let manifest = self.manifests.get(&d.name);
                let gulp = self.gulps.get(&d.name);
                let listing = match gulp {
                    Some(_) => None,
                    None => Some(self.listing(&d.name)),
                };
                DatasetSummary {
                    name: d.name.clone(),
                    root: d.root.display().to_string(),
                    video_count: match (gulp, &listing) {
                        (Some(g), _) => g.len() as u64,
                        (None, Some(l)) => l.videos,
                        (None, None) => 0,
                    },
                    samples: match (manifest, &listing) {
                        (Some(m), _) => m.len() as u64,
                        (None, Some(l)) => l.samples.len() as u64,
                        (None, None) => 0,
                    },
                    classes: manifest.map(|m| m.classes()).unwrap_or_default(),
                }
            })
            .collect()
    }

    /// The current walk of directory dataset `name`, walking it now if it never was (blocking).
    fn listing(&self, name: &str) -> Listing {
        if let Some(l) = self.listings.read().get(name) {
            return l.clone();
        }
        let _one = self.walking.lock();
        if let Some(l) = self.listings.read().get(name) {
            return l.clone();
        }
        let l = self.walk(name);
        self.listings.write().insert(name.to_owned(), l.clone());
        l
    }

    fn walk(&self, name: &str) -> Listing {
        let Some(d) = self.datasets.get(name) else {
            return Listing {
                samples: Arc::new(Samples::from_labeled(Vec::new())),
                videos: 0,
            };
        };
        let found = crate::dataset::walk_videos(&d.root);
        let videos = found.len() as u64;
        Listing {
            samples: Arc::new(Samples::from_paths(&d.root, found)),
            videos,
        }
    }

    /// Walks every directory dataset again and swaps each listing whole (blocking). Returns the
    /// datasets whose video count changed.
    pub fn rescan(&self) -> Vec<String> {
        let mut changed = Vec::new();
        for (name, _) in self
            .datasets
            .iter()
            .filter(|(n, _)| !self.gulps.contains_key(*n))
        {
            let _one = self.walking.lock();
            let fresh = self.walk(name);
            let before = self.listings.read().get(name).map(|l| l.videos);
            if before != Some(fresh.videos) {
                tracing::info!(dataset = %name, videos = fresh.videos, "dataset listed");
                changed.push(name.clone());
            }
            self.listings.write().insert(name.clone(), fresh);
        }
        changed
    }

    /// Lists every directory dataset now on a named thread, then again every `every` (zero: only on
    /// [`Catalog::rescan`] calls, as on SIGHUP), until the catalogue is dropped.
    pub fn start_rescans(catalog: &Arc<Catalog>, every: std::time::Duration) {
        let weak = Arc::downgrade(catalog);
        let spawned = std::thread::Builder::new()
            .name("vserve-catalogue".into())
            .spawn(move || {
                let mut first = true;
                loop {
                    let Some(cat) = weak.upgrade() else { return };
                    if first || !every.is_zero() {
                        cat.rescan();
                    }
                    drop(cat);
                    if every.is_zero() {
                        return;
                    }
                    first = false;
                    std::thread::sleep(every);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no catalogue thread: datasets are listed when first asked for");
        }
    }

    /// Video indexes built since start-up.
    pub fn index_builds(&self) -> u64 {
        self.index_builds.load(Ordering::Relaxed)
    }

    pub fn dataset(&self, name: &str) -> Result<&Dataset, Error> {
        self.datasets
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("dataset {name:?} not served here")))
    }

    /// A dataset's samples: its manifest (or gulp set), else the catalogue's listing of its root.
    pub async fn samples(self: &Arc<Self>, dataset: &str) -> Result<Arc<Samples>, Error> {
        self.dataset(dataset)?;
        if let Some(s) = self.manifests.get(dataset) {
            return Ok(s.clone());
        }
        if let Some(l) = self.listings.read().get(dataset) {
            return Ok(l.samples.clone());
        }
        let (this, name) = (self.clone(), dataset.to_owned());
        blocking(move || Ok(this.listing(&name).samples)).await
    }

    /// Resolves and indexes one video on a blocking thread, within the index-build bound.
    pub async fn resolve(
        self: &Arc<Self>,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
    ) -> Result<Resolved, Error> {
        let permit = self.index_permit().await?;
        let (this, d, v) = (self.clone(), dataset.to_owned(), video.to_owned());
        blocking(move || {
            let _permit = permit;
            this.resolve_blocking(&d, &v, stream)
        })
        .await
    }

    /// Resolves and indexes several videos in parallel (each within the index-build bound), in order.
    pub async fn resolve_all(
        self: &Arc<Self>,
        dataset: &str,
        videos: &[(String, Option<u32>)],
    ) -> Result<Vec<Resolved>, Error> {
        let timer = Timer::start();
        let mut handles = Vec::with_capacity(videos.len());
        for (video, stream) in videos {
            let (this, d, v, s) = (self.clone(), dataset.to_owned(), video.clone(), *stream);
            let permit = self.index_permit().await?;
            handles.push(tokio::task::spawn_blocking(move || {
                let _permit = permit;
                this.resolve_blocking(&d, &v, s)
            }));
        }
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(
                h.await
                    .map_err(|e| Error::Internal(format!("index task failed: {e}")))??,
            );
        }
        timer.observe(&self.metrics.index);
        Ok(out)
    }

    /// Records that a video's coded data is damaged, so its next index comes from a decode.
    pub fn mark_damaged(&self, id: &VideoId, detail: &str) {
        let mut plain = id.clone();
        plain.decode_table = false;
        if self.damaged.lock().insert(plain) {
            self.metrics.damaged_files.inc();
            tracing::warn!(path = %id.path.display(), %detail, "decode errors in a cleanly scanned file; indexing it by decoding");
        }
    }

    async fn index_permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Error> {
        self.index_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::ShuttingDown)
    }

    /// Resolves and indexes one video. Blocking (FFmpeg); call from a blocking thread.
    fn resolve_blocking(
        &self,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
    ) -> Result<Resolved, Error> {
        let ds = self.dataset(dataset)?;
        if let Some(g) = self.gulps.get(dataset) {
            return self.index_stored(g, video);
        }
        let (path, meta) = ds.resolve(video)?;
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i128);
        let mut id = VideoId {
            path: path.clone(),
            size: meta.len(),
            mtime_ns,
            stream,
            decode_table: false,
        };
        id.decode_table = self.damaged.lock().contains(&id);
        if let Some(e) = self.failed.get(&id) {
            return Err(e.into());
        }
        let mut stored = self.recall(&mut id);
        if let Some(e) = self.refusal(&id) {
            return Err(e);
        }
        let id = Arc::new(id);
        let force_decode = id.decode_table;
        let index = self
            .indexes
            .try_get_with(id.clone(), || {
                if let Some(table) = stored.take() {
                    return Ok(table);
                }
                self.index_builds.fetch_add(1, Ordering::Relaxed);
                let started = std::time::Instant::now();
                let built = crate::decode::ffmpeg::build_index(
                    &path,
                    stream.map(|s| s as usize),
                    force_decode,
                );
                if let Ok(ix) = &built {
                    tracing::debug!(
                        path = %path.display(),
                        frames = ix.frame_count(),
                        method = ?ix.method,
                        ms = started.elapsed().as_millis() as u64,
                        "indexed"
                    );
                }
                let built = built.map(Arc::new);
                self.remember(&id, &built);
                built
            })
            .map_err(|e| {
                self.metrics.index_failures.inc();
                self.failed.insert(id.clone(), (*e).clone());
                Error::from((*e).clone())
            })?;
        let source = VideoSource {
            path,
            index: index.clone(),
            gulp: None,
        };
        Ok((id, index, source))
    }

    /// The stored table for `id` when the index cache lacks it, learning the video's health on the way
    /// (a record of a damaged file switches `id` to its decode table).
    fn recall(&self, id: &mut VideoId) -> Option<Arc<VideoIndex>> {
        let store = self.store.as_ref()?;
        if self.indexes.contains_key(id) {
            return None;
        }
        let record = store.get(&key_of(id))?;
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
    fn remember(&self, id: &VideoId, built: &Result<Arc<VideoIndex>, IndexError>) {
        let Some(store) = &self.store else { return };
        let (health, table) = match built {
            Ok(ix) if ix.damaged => (
                crate::check::health_of(&id.path, id.stream),
                Some(ix.clone()),
            ),
            Ok(ix) => (Health::Unchecked, Some(ix.clone())),
            Err(IndexError::Corrupt { reason, .. }) => (
                Health::Unreadable {
                    reason: reason.clone(),
                    corrupt: true,
                },
                None,
            ),
            Err(e @ IndexError::NoVideo { .. }) => (
                Health::Unreadable {
                    reason: e.to_string(),
                    corrupt: false,
                },
                None,
            ),
            // Opening can fail for passing reasons (permissions, descriptors): not remembered.
            Err(IndexError::Open { .. }) => return,
        };
        let record = Record {
            key: key_of(id),
            health,
            decode_table: id.decode_table,
            table,
            written_ms: 0,
        };
        self.learn(&record);
        if let Err(e) = store.put(&record) {
            tracing::warn!(path = %id.path.display(), error = %e, "cannot write the store");
        }
    }

    /// The error for a video the store knows not to open (unreadable, quarantined).
    fn refusal(&self, id: &VideoId) -> Option<Error> {
        let mut plain = id.clone();
        plain.decode_table = false;
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

    /// [`Catalog::resolve`] as a sampler needs it: a damaged video's table stops before its first bad
    /// frame (decoding still uses the whole table), one with no good frame is refused.
    pub async fn resolve_for_sampling(
        self: &Arc<Self>,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
    ) -> Result<Resolved, Error> {
        let (id, index, source) = self.resolve(dataset, video, stream).await?;
        let mut plain = (*id).clone();
        plain.decode_table = false;
        let usable = match self.health.lock().get(&plain) {
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
        view.keyframes.retain(|&k| k < usable);
        Ok((id, Arc::new(view), source))
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
            decode_table: false,
        });
        let index = self
            .indexes
            .try_get_with(id.clone(), || g.index(video).map(Arc::new))
            .map_err(|e| Error::from((*e).clone()))?;
        let source = VideoSource {
            path: id.path.clone(),
            index: index.clone(),
            gulp: Some(GulpVideo {
                dataset: g.clone(),
                id: video.into(),
            }),
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
