//! The catalogue's listings of directory datasets: what the last walk of each root found (its videos as
//! samples, and their count). Walked in the background at start, again every `--rescan-interval` and on
//! SIGHUP, each listing swapped whole; ListDatasets and stream planning read them and never walk.

use std::sync::Arc;

use super::Catalog;
use crate::manifest::Samples;
use crate::request::DatasetSummary;

/// One walk of a directory dataset.
#[derive(Clone)]
pub(super) struct Listing {
    /// The videos found, as samples (unused for datasets with a manifest).
    pub(super) samples: Arc<Samples>,
    pub(super) videos: u64,
}

impl Catalog {
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
    pub(super) fn listing(&self, name: &str) -> Listing {
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
}
