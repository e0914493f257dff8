//! The catalogue's listings: each dataset's sample list as one compact [`Samples`] (a manifest's rows,
//! a gulp set's ids, or the videos the last walk of a directory root found) and its video count.
//!
//! Input: the datasets opened by [`Catalog::open`] (manifests already parsed). Output: what
//! ListDatasets ([`Catalog::datasets`]) and stream planning ([`Catalog::samples`]) read.
//!
//! Invariants: directory roots are walked in the background at start ([`Catalog::start_rescans`]), again
//! every `--rescan-interval`, on SIGHUP and on the Reload RPC (`vserve reload`, [`Catalog::reload`]),
//! which also re-read manifests; each listing is built aside and swapped whole under a write lock held
//! for a pointer swap, so a reader sees the old or the new list, never a mix. One walk at a time;
//! a reload asked for while a walk it would repeat is under way waits for that walk and does not walk
//! again. ListDatasets never walks: before a root's first walk completes it reports the videos found so
//! far with `building` set. A stream planned before the first walk completes waits for it (never walks
//! per stream). A manifest that no longer parses on reload keeps its previous samples (the error is
//! logged and returned); a walk that cannot read a directory keeps the previous list's videos under it
//! (all of them when the root is unreadable) and lists the rest afresh. Gulp datasets are read once at start.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::Catalog;
use crate::error::{blocking, Error};
use crate::manifest::{Samples, SamplesBuilder};
use crate::request::DatasetSummary;

/// One complete walk of a directory root.
#[derive(Clone)]
struct Listing {
    /// The videos found, sorted (None for a dataset whose samples come from its manifest: the walk
    /// only counts).
    samples: Option<Arc<Samples>>,
    videos: u64,
    /// The walk found or missed something the last walk of its root did not (its lines are logged at
    /// INFO and WARN; otherwise at DEBUG).
    news: bool,
}

/// How long a reload waits for the one before it to end.
pub const RELOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A walk of one root under way.
#[derive(Default)]
struct Progress {
    /// Videos found so far by the walk under way (or the last one).
    found: AtomicU64,
    walking: AtomicBool,
    /// Walks started, for coalescing reloads.
    started: AtomicU64,
    /// What the last walk found and could not read, as logged: a walk that finds the same is logged at
    /// DEBUG only (a client looping Reload wrote two lines a reload).
    said: Mutex<Option<(u64, String)>>,
}

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Reloaded {
    /// Datasets whose videos or samples changed.
    pub changed: Vec<String>,
    /// What could not be reloaded (each dataset keeps its previous list).
    pub errors: Vec<String>,
}

/// Every dataset's current lists (see the module comment).
pub(super) struct Listings {
    /// Samples from a manifest or a gulp set, by dataset; swapped whole on reload.
    manifests: RwLock<BTreeMap<String, Arc<Samples>>>,
    /// The manifest file of each dataset that has one, re-read on reload.
    manifest_files: BTreeMap<String, PathBuf>,
    /// The last walk of each directory root (with what an incomplete one could not read kept from
    /// the list before it: `install_walk`).
    walked: RwLock<BTreeMap<String, Listing>>,
    /// Every directory dataset (every dataset but gulp sets) and its walk's progress.
    progress: BTreeMap<String, Progress>,
    /// One walk at a time.
    walking: Mutex<()>,
    /// One reload at a time: reloads begun so far, and the last one's outcome (a reload asked while
    /// another ran is answered by the next one to begin after it was asked, not one per caller).
    reloading: Mutex<(u64, Reloaded)>,
    reloads_begun: std::sync::atomic::AtomicU64,
    /// The lists each dataset's last swaps replaced, newest last (at most [`RETIRED_KEPT`]): a stream
    /// pinned to one of them (StreamBatches' samples_fingerprint) still plans over it.
    retired: Mutex<BTreeMap<String, Vec<Arc<Samples>>>>,
}

/// Replaced sample lists kept per dataset for streams pinned to them.
pub const RETIRED_KEPT: usize = 2;

impl Listings {
    /// `walked`: the datasets whose roots are walked (all but gulp sets).
    pub(super) fn new(
        manifests: BTreeMap<String, Arc<Samples>>,
        manifest_files: BTreeMap<String, PathBuf>,
        walked: Vec<String>,
    ) -> Listings {
        Listings {
            manifests: RwLock::new(manifests),
            manifest_files,
            walked: RwLock::new(BTreeMap::new()),
            progress: walked
                .into_iter()
                .map(|n| (n, Progress::default()))
                .collect(),
            walking: Mutex::new(()),
            reloading: Mutex::new((0, Reloaded::default())),
            reloads_begun: std::sync::atomic::AtomicU64::new(0),
            retired: Mutex::new(BTreeMap::new()),
        }
    }

    /// Keeps `old`, replaced by `new` in dataset `name`'s listing, for pinned streams.
    fn retire(&self, name: &str, old: Option<Arc<Samples>>, new: Option<&Arc<Samples>>) {
        let Some(old) = old else { return };
        if new.is_some_and(|n| n.fingerprint() == old.fingerprint()) {
            return;
        }
        let mut retired = self.retired.lock();
        let kept = retired.entry(name.to_owned()).or_default();
        kept.retain(|k| k.fingerprint() != old.fingerprint());
        kept.push(old);
        if kept.len() > RETIRED_KEPT {
            kept.remove(0);
        }
    }

    /// Swaps in a walk of directory dataset `name`, keeping the list it replaces.
    fn swap_walked(&self, name: &str, fresh: Listing) {
        let new = fresh.samples.clone();
        let old = self.walked.write().insert(name.to_owned(), fresh);
        self.retire(name, old.and_then(|l| l.samples), new.as_ref());
    }
}

/// A walk's list `new` with the videos of `old` under `dirs` (directories relative to the root that the
/// walk could not read) added back, sorted, and how many were added.
fn keep_under(new: &Samples, old: &Samples, dirs: &[String]) -> (Samples, usize) {
    let under = |video: &str| {
        dirs.iter().any(|d| {
            video
                .strip_prefix(d.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        })
    };
    let mut b = SamplesBuilder::new();
    for s in new.iter() {
        b.push(s.video, None, None, None);
    }
    // A directory that failed partway through its entries gave the walk some of them already.
    let found: std::collections::HashSet<&str> =
        new.iter().map(|s| s.video).filter(|v| under(v)).collect();
    let mut kept = 0;
    for s in old
        .iter()
        .filter(|s| under(s.video) && !found.contains(s.video))
    {
        b.push(s.video, None, None, None);
        kept += 1;
    }
    (b.finish_sorted(), kept)
}

/// How often a walk publishes its count of videos found.
const PUBLISH_EVERY: u64 = 1024;

impl Catalog {
    /// The datasets served (`only` this one when given), from the catalogue; never walks (see the module
    /// comment). `labels`: with each manifest's labels (a string each: a million cost seconds).
    pub fn datasets(&self, only: Option<&str>, labels: bool) -> Vec<DatasetSummary> {
        let manifests = self.listings.manifests.read().clone();
        let walked = self.listings.walked.read().clone();
        self.datasets
            .values()
            .filter(|d| only.is_none_or(|name| d.name == name))
            .map(|d| {
                let manifest = manifests.get(&d.name);
                let listing = walked.get(&d.name);
                let progress = self.listings.progress.get(&d.name);
                let found = progress.map_or(0, |p| p.found.load(Ordering::Relaxed));
                let video_count = match (self.gulps.get(&d.name), listing) {
                    (Some(g), _) => g.len() as u64,
                    (None, Some(l)) => l.videos,
                    (None, None) => found,
                };
                let list = manifest.or(listing.and_then(|l| l.samples.as_ref()));
                let samples = list.map_or(found, |s| s.len() as u64);
                let samples_fingerprint = list.map_or(0, |s| s.fingerprint());
                DatasetSummary {
                    name: d.name.clone(),
                    root: d.root.display().to_string(),
                    video_count,
                    samples,
                    classes: manifest
                        .filter(|_| labels)
                        .map(|m| m.classes())
                        .unwrap_or_default(),
                    building: progress
                        .is_some_and(|p| p.walking.load(Ordering::Relaxed) || listing.is_none()),
                    samples_fingerprint,
                }
            })
            .collect()
    }

    /// A dataset's samples: its manifest (or gulp set), else the last walk of its root (waiting for
    /// the first walk if it has not completed, on a blocking thread).
    pub async fn samples(self: &Arc<Self>, dataset: &str) -> Result<Arc<Samples>, Error> {
        self.dataset(dataset)?;
        if let Some(s) = self.listings.manifests.read().get(dataset) {
            return Ok(s.clone());
        }
        if let Some(s) = self
            .listings
            .walked
            .read()
            .get(dataset)
            .and_then(|l| l.samples.clone())
        {
            return Ok(s);
        }
        let (this, name) = (self.clone(), dataset.to_owned());
        blocking(move || Ok(this.listing(&name))).await
    }

    /// [`Catalog::samples`], or with `pinned` the list with that fingerprint: the current one, or one of
    /// the last it replaced ([`RETIRED_KEPT`]); FAILED_PRECONDITION when none is.
    pub async fn samples_pinned(
        self: &Arc<Self>,
        dataset: &str,
        pinned: Option<u64>,
    ) -> Result<Arc<Samples>, Error> {
        let current = self.samples(dataset).await?;
        let Some(want) = pinned else {
            return Ok(current);
        };
        if current.fingerprint() == want {
            return Ok(current);
        }
        let retired = self.listings.retired.lock();
        if let Some(old) = retired
            .get(dataset)
            .and_then(|kept| kept.iter().find(|k| k.fingerprint() == want))
        {
            return Ok(old.clone());
        }
        Err(Error::FailedPrecondition(format!(
            "the samples of dataset {dataset:?} with fingerprint {want:016x} are no longer held (the list has changed more than {RETIRED_KEPT} times since; now {:016x}): start the epoch again over the current list",
            current.fingerprint()
        )))
    }

    /// The samples of the last walk of directory dataset `name`, walking it now if it never was.
    fn listing(&self, name: &str) -> Arc<Samples> {
        let walked = |this: &Catalog| {
            this.listings
                .walked
                .read()
                .get(name)
                .and_then(|l| l.samples.clone())
        };
        if let Some(s) = walked(self) {
            return s;
        }
        let _one = self.listings.walking.lock();
        if let Some(s) = walked(self) {
            return s;
        }
        let (fresh, trouble) = self.walk(name);
        let samples = fresh.samples.clone().unwrap_or_default();
        let _ = self.install_walk(name, fresh, &trouble);
        samples
    }

    /// Walks directory dataset `name`'s root (the caller holds `walking`).
    fn walk(&self, name: &str) -> (Listing, crate::dataset::WalkTrouble) {
        let (Some(d), Some(p)) = (self.datasets.get(name), self.listings.progress.get(name)) else {
            let empty = Listing {
                samples: Some(Arc::default()),
                videos: 0,
                news: false,
            };
            return (empty, Default::default());
        };
        let keep = !self.listings.manifest_files.contains_key(name);
        p.started.fetch_add(1, Ordering::AcqRel);
        p.found.store(0, Ordering::Relaxed);
        p.walking.store(true, Ordering::Release);
        let started = std::time::Instant::now();
        let mut builder = SamplesBuilder::new();
        let mut videos = 0u64;
        let trouble = crate::dataset::visit_videos(&d.root, &mut |rel| {
            videos += 1;
            if videos.is_multiple_of(PUBLISH_EVERY) {
                p.found.store(videos, Ordering::Relaxed);
            }
            if keep {
                builder.push(rel, None, None, None);
            }
        });
        p.found.store(videos, Ordering::Relaxed);
        let samples = keep.then(|| Arc::new(builder.finish_sorted()));
        p.walking.store(false, Ordering::Release);
        let left_out = if trouble.any() {
            trouble.describe()
        } else {
            String::new()
        };
        let news = p.said.lock().replace((videos, left_out.clone())) != Some((videos, left_out));
        let seconds = started.elapsed().as_secs_f64();
        let bytes = samples.as_ref().map_or(0, |s| s.approx_bytes());
        if news || seconds >= 1.0 {
            tracing::info!(dataset = %name, videos, bytes, seconds, "dataset root walked");
        } else {
            tracing::debug!(dataset = %name, videos, bytes, seconds, "dataset root walked (as before)");
        }
        (
            Listing {
                samples,
                videos,
                news,
            },
            trouble,
        )
    }

    /// Swaps in a walk of `name`. An incomplete walk (an unreadable directory: permissions, a failing
    /// disk, a dropped mount) must not shrink the dataset until it reads again: the videos the held list
    /// has under the unreadable directories are kept alongside what the walk found elsewhere, and the
    /// whole held list is kept when the root itself, or more directories than are named one by one,
    /// could not be read. Returns the videos listed if a list was swapped in, and what the walk could
    /// not read (logged here, once).
    fn install_walk(
        &self,
        name: &str,
        mut fresh: Listing,
        trouble: &crate::dataset::WalkTrouble,
    ) -> (Option<u64>, Option<String>) {
        if trouble.complete() {
            if trouble.any() && fresh.news {
                tracing::warn!(dataset = %name, "the walk left out {}", trouble.describe());
            }
            let videos = fresh.videos;
            self.listings.swap_walked(name, fresh);
            return (Some(videos), None);
        }
        let held = self
            .listings
            .walked
            .read()
            .get(name)
            .map(|l| l.samples.clone());
        let news = fresh.news;
        let why = |kept: &str| {
            let why = format!(
                "dataset {name:?}: the walk could not read {}; {kept}",
                trouble.describe()
            );
            if news {
                tracing::warn!(dataset = %name, "{why}");
            } else {
                tracing::debug!(dataset = %name, "{why}");
            }
            why
        };
        let kept = match (&held, &trouble.unreadable, &fresh.samples) {
            (None, _, _) => "listed what it could read (there was no list before)".to_owned(),
            (Some(Some(old)), Some(dirs), Some(new)) if !dirs.iter().any(|d| d.is_empty()) => {
                let (samples, kept) = keep_under(new, old, dirs);
                fresh.videos = samples.len() as u64;
                fresh.samples = Some(Arc::new(samples));
                format!("the {kept} videos listed under them before are kept")
            }
            (Some(_), _, _) => return (None, Some(why("the previous list is kept"))),
        };
        let why = why(&kept);
        let videos = fresh.videos;
        self.listings.swap_walked(name, fresh);
        (Some(videos), Some(why))
    }

    /// Walks every directory root again and re-reads every manifest, swapping each list whole
    /// (blocking). Returns the datasets whose videos changed.
    pub fn rescan(&self) -> Vec<String> {
        self.reload().changed
    }

    /// Walks every directory root again (unless a walk began after this call and has completed, which
    /// is as fresh) and re-reads every manifest, swapping each list whole (blocking). One reload runs at
    /// a time; callers that ask while one runs share the next one (a reload that began after they
    /// asked is as fresh): 8 threads calling Reload in a loop over a 300k-row manifest parsed it 8
    /// times over and slowed other clients' stream starts tenfold.
    ///
    /// A caller waits at most [`RELOAD_WAIT`] for the reload before it: one stuck in a read that never
    /// returns (a hung mount) held the lock for good, and each Reload call after it held a blocking
    /// thread for good too, until the runtime's pool of them ran out.
    pub fn reload(&self) -> Reloaded {
        self.reload_within(RELOAD_WAIT)
    }

    fn reload_within(&self, wait: std::time::Duration) -> Reloaded {
        let asked = self.listings.reloads_begun.load(Ordering::Acquire);
        let Some(mut last) = self.listings.reloading.try_lock_for(wait) else {
            let why = format!(
                "a reload begun earlier has run for over {} s (a read that does not return: a hung mount?); \
                 this one gave up waiting for it, and the datasets keep their lists",
                wait.as_secs_f64()
            );
            tracing::warn!("{why}");
            return Reloaded {
                errors: vec![why],
                ..Reloaded::default()
            };
        };
        if last.0 > asked {
            // A reload began after this call and has completed (this one waited for it).
            return last.1.clone();
        }
        let generation = self.listings.reloads_begun.fetch_add(1, Ordering::AcqRel) + 1;
        let out = self.reload_now();
        *last = (generation, out.clone());
        out
    }

    fn reload_now(&self) -> Reloaded {
        let mut out = Reloaded::default();
        for (name, ds) in &self.datasets {
            if let Some(now) = ds.root_moved() {
                let why = format!(
                    "dataset {name:?}: its root {} leads to {} now, but {} is served (resolved at start): restart the daemon to serve the new one",
                    ds.given_through_symlink().unwrap_or(&ds.root).display(),
                    now.display(),
                    ds.root.display()
                );
                tracing::warn!("{why}");
                out.errors.push(why);
            }
        }
        for (name, file) in &self.listings.manifest_files {
            match Samples::from_manifest(file) {
                Ok(fresh) => {
                    let fresh = Arc::new(fresh);
                    let old = self
                        .listings
                        .manifests
                        .write()
                        .insert(name.clone(), fresh.clone());
                    self.listings.retire(name, old.clone(), Some(&fresh));
                    if old.as_deref() != Some(&*fresh) {
                        tracing::info!(dataset = %name, samples = fresh.len(), "manifest read again");
                        if let Some(w) = fresh.warning() {
                            tracing::warn!(dataset = %name, manifest = %file.display(), "{w}");
                        }
                        out.changed.push(name.clone());
                    }
                }
                Err(e) => {
                    tracing::warn!(dataset = %name, error = %e, "manifest not reloaded: the previous samples are kept");
                    out.errors.push(format!("dataset {name:?}: {e}"));
                }
            }
        }
        for (name, p) in &self.listings.progress {
            let asked = p.started.load(Ordering::Acquire);
            let _one = self.listings.walking.lock();
            if p.started.load(Ordering::Acquire) > asked
                && self.listings.walked.read().contains_key(name)
            {
                // A walk began after this reload was asked for and has completed: as fresh.
                continue;
            }
            let (fresh, trouble) = self.walk(name);
            // The list itself, not its length: a video renamed, or one gone and another come, keeps the
            // count (such reloads said nothing changed: probe E).
            let list = |l: &Listing| (l.videos, l.samples.as_ref().map(|s| s.fingerprint()));
            let before = self.listings.walked.read().get(name).map(list);
            let (listed, problem) = self.install_walk(name, fresh, &trouble);
            let after = self.listings.walked.read().get(name).map(list);
            if let Some(videos) = listed.filter(|_| before != after) {
                if !out.changed.contains(name) {
                    tracing::info!(dataset = %name, videos, "dataset listed");
                    out.changed.push(name.clone());
                }
            }
            out.errors.extend(problem);
        }
        out
    }

    /// Lists every directory dataset now on a named thread, then again every `every` (zero: only on
    /// [`Catalog::reload`] calls, as on SIGHUP), until the catalogue is dropped. A periodic walk never
    /// takes more than 2 % of a core: the pause after a walk is at least [`RESCAN_PAUSE_FACTOR`] times
    /// its duration (a million files on a slow disk are walked less often than `every`).
    pub fn start_rescans(catalog: &Arc<Catalog>, every: std::time::Duration) {
        let weak = Arc::downgrade(catalog);
        let spawned = std::thread::Builder::new()
            .name("vserve-catalogue".into())
            .spawn(move || {
                let mut first = true;
                loop {
                    let Some(cat) = weak.upgrade() else { return };
                    let started = std::time::Instant::now();
                    if first {
                        cat.walk_unlisted();
                    } else {
                        cat.rescan();
                    }
                    drop(cat);
                    if every.is_zero() {
                        return;
                    }
                    first = false;
                    std::thread::sleep(rescan_pause(every, started.elapsed()));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no catalogue thread: datasets are listed when first asked for");
        }
    }

    /// The first walk of every root not walked yet (manifests were read at start).
    fn walk_unlisted(&self) {
        for name in self.listings.progress.keys() {
            let _one = self.listings.walking.lock();
            if self.listings.walked.read().contains_key(name) {
                continue;
            }
            let (fresh, trouble) = self.walk(name);
            let _ = self.install_walk(name, fresh, &trouble);
        }
    }
}

/// The pause after a periodic walk is at least this many times the walk's duration.
pub const RESCAN_PAUSE_FACTOR: u32 = 50;

/// How long to wait before the next periodic walk, after one that took `took`.
fn rescan_pause(every: std::time::Duration, took: std::time::Duration) -> std::time::Duration {
    every.max(took.saturating_mul(RESCAN_PAUSE_FACTOR))
}

#[cfg(test)]
#[path = "listing_tests.rs"]
mod tests;
