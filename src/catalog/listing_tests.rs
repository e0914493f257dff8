//! Tests of the catalogue's listings (`listing.rs`).

#[test]
fn periodic_walks_take_at_most_a_fiftieth_of_the_time() {
    use std::time::Duration;
    let minute = Duration::from_secs(60);
    assert_eq!(
        super::rescan_pause(minute, Duration::from_millis(100)),
        minute
    );
    assert_eq!(
        super::rescan_pause(minute, Duration::from_secs(4)),
        Duration::from_secs(200)
    );
}

use super::*;
use crate::config::load::ServeArgs;
use crate::metrics::EngineMetrics;

fn catalog(root: &std::path::Path, manifest: Option<PathBuf>) -> Arc<Catalog> {
    let mut dataset = format!("d={}", root.display());
    if let Some(m) = manifest {
        dataset.push_str(&format!(":manifest={}", m.display()));
    }
    let config = ServeArgs {
        dataset: vec![dataset],
        ..ServeArgs::default()
    }
    .to_config()
    .unwrap();
    Arc::new(Catalog::open(&config, EngineMetrics::default()).unwrap())
}

fn touch(root: &std::path::Path, rel: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"x").unwrap();
}

#[tokio::test]
async fn lists_are_built_aside_and_swapped_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["b/2.mp4", "a/1.mkv", "b/1.webm", "notes.txt"] {
        touch(dir.path(), f);
    }
    let cat = catalog(dir.path(), None);
    // Before any walk: building, nothing counted; ListDatasets did not walk.
    let d = &cat.datasets(None, true)[0];
    assert_eq!((d.building, d.video_count, d.samples), (true, 0, 0));
    // A stream's planning waits for the (first) walk.
    let s = cat.samples("d").await.unwrap();
    let got: Vec<&str> = s.iter().map(|s| s.video).collect();
    assert_eq!(got, vec!["a/1.mkv", "b/1.webm", "b/2.mp4"]);
    let d = &cat.datasets(None, true)[0];
    assert_eq!((d.building, d.video_count, d.samples), (false, 3, 3));
    // A new file is not seen until a reload; readers holding the old list keep it.
    touch(dir.path(), "a/0.mp4");
    assert_eq!(cat.datasets(None, true)[0].video_count, 3);
    let r = cat.reload();
    assert_eq!(
        r,
        Reloaded {
            changed: vec!["d".into()],
            errors: vec![]
        }
    );
    assert_eq!(s.len(), 3);
    let now = cat.samples("d").await.unwrap();
    assert_eq!(now.video(0), "a/0.mp4");
    assert_eq!(cat.datasets(None, true)[0].video_count, 4);
    assert_eq!(cat.reload(), Reloaded::default());
    // A rename keeps the count, and so does one video gone and another come: still a change (such
    // reloads said nothing changed: probe E).
    std::fs::rename(dir.path().join("a/0.mp4"), dir.path().join("a/9.mp4")).unwrap();
    assert_eq!(cat.reload().changed, ["d"]);
    std::fs::remove_file(dir.path().join("b/1.webm")).unwrap();
    touch(dir.path(), "c/1.mp4");
    assert_eq!(cat.reload().changed, ["d"]);
    assert_eq!(cat.datasets(None, true)[0].video_count, 4);
    assert_eq!(cat.reload(), Reloaded::default());
}

#[tokio::test]
async fn a_manifest_is_read_again_on_reload_and_a_broken_one_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    touch(dir.path(), "v.mp4");
    let m = dir.path().join("m.csv");
    std::fs::write(&m, "path,label\nv.mp4,dog\nv.mp4,cat\n").unwrap();
    let cat = catalog(dir.path(), Some(m.clone()));
    let before = cat.samples("d").await.unwrap();
    assert_eq!(before.len(), 2);
    assert_eq!(
        cat.datasets(None, true)[0].classes,
        vec![("cat".to_owned(), 0), ("dog".to_owned(), 1)]
    );
    std::fs::write(&m, "path,label\nv.mp4,dog\nv.mp4,cat\nv.mp4,ant\n").unwrap();
    let r = cat.reload();
    assert_eq!(r.changed, vec!["d".to_owned()]);
    assert_eq!(cat.samples("d").await.unwrap().len(), 3);
    let d = &cat.datasets(None, true)[0];
    assert_eq!((d.video_count, d.samples, d.building), (1, 3, false));
    assert_eq!(d.classes[0], ("ant".to_owned(), 0));
    std::fs::write(&m, "path,start\nv.mp4,never\n").unwrap();
    let r = cat.reload();
    assert!(r.changed.is_empty(), "{r:?}");
    assert_eq!(r.errors.len(), 1);
    assert!(r.errors[0].contains("line 2"), "{r:?}");
    assert_eq!(cat.samples("d").await.unwrap().len(), 3);
}

/// Callers that ask for a reload while one runs share the next one: four threads asking during a
/// reload cause one more reload, not four, and all four see the manifest's change.
#[tokio::test]
async fn reloads_asked_while_one_runs_share_the_next() {
    let dir = tempfile::tempdir().unwrap();
    touch(dir.path(), "v.mp4");
    let m = dir.path().join("m.csv");
    std::fs::write(&m, "path,label\nv.mp4,dog\n").unwrap();
    let cat = Arc::new(catalog(dir.path(), Some(m.clone())));
    assert_eq!(cat.samples("d").await.unwrap().len(), 1);
    std::fs::write(&m, "path,label\nv.mp4,dog\nv.mp4,cat\n").unwrap();
    // A reload in progress (begun before the four ask).
    let held = cat.listings.reloading.lock();
    cat.listings.reloads_begun.fetch_add(1, Ordering::AcqRel);
    let askers: Vec<_> = (0..4)
        .map(|_| {
            let cat = cat.clone();
            std::thread::spawn(move || cat.reload())
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(200)); // all four wait on the lock
    drop(held);
    for a in askers {
        assert_eq!(a.join().unwrap().changed, vec!["d".to_owned()]);
    }
    assert_eq!(
        cat.listings.reloads_begun.load(Ordering::Acquire),
        2,
        "one reload for the four"
    );
    assert_eq!(cat.samples("d").await.unwrap().len(), 2);
}

/// A reload stuck for good (a read of a hung mount) keeps its lock; a reload asked after it gives up
/// waiting at its bound with an error, instead of holding its thread for good.
#[test]
fn a_reload_gives_up_waiting_for_one_that_never_ends() {
    let dir = tempfile::tempdir().unwrap();
    touch(dir.path(), "v.mp4");
    let cat = catalog(dir.path(), None);
    let stuck = cat.listings.reloading.lock();
    let start = std::time::Instant::now();
    let r = cat.reload_within(std::time::Duration::from_millis(200));
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    assert!(r.changed.is_empty());
    assert!(r.errors[0].contains("gave up waiting"), "{r:?}");
    drop(stuck);
    assert!(cat.reload().errors.is_empty());
}

#[test]
fn an_unreadable_directory_keeps_the_videos_listed_under_it_before() {
    let old = samples(&[
        "a.mp4",
        "sub/b.mp4",
        "sub/x/y.mp4",
        "subway.mp4",
        "other/d.mp4",
        "deep/s/1.mp4",
        "deep/s/2.mp4",
    ]);
    // "sub" and "deep/s" could not be read ("deep/s" after giving one entry); the rest was listed.
    let new = samples(&["a.mp4", "sub2/c.mp4", "deep/s/1.mp4"]);
    let (merged, kept) = keep_under(&new, &old, &["sub".into(), "deep/s".into()]);
    let got: Vec<&str> = merged.iter().map(|s| s.video).collect();
    assert_eq!(
        got,
        vec![
            "a.mp4",
            "deep/s/1.mp4",
            "deep/s/2.mp4",
            "sub/b.mp4",
            "sub/x/y.mp4",
            "sub2/c.mp4"
        ]
    );
    assert_eq!(kept, 3);
}

/// A directory too deep to open (its path over PATH_MAX) is left out with a warning; it does not
/// make every later walk keep the previous list (new files went unseen for as long as it existed).
#[tokio::test]
async fn a_directory_too_long_to_open_does_not_freeze_the_list() {
    let dir = tempfile::tempdir().unwrap();
    touch(dir.path(), "a.mp4");
    let cat = catalog(dir.path(), None);
    assert_eq!(cat.samples("d").await.unwrap().len(), 1);
    crate::dataset::make_too_long_dir(dir.path());
    touch(dir.path(), "b.mp4");
    let r = cat.reload();
    assert_eq!(
        r,
        Reloaded {
            changed: vec!["d".into()],
            errors: vec![]
        }
    );
    let got = listed_videos(&cat).await;
    assert_eq!(got, vec!["a.mp4", "b.mp4"]);
}

/// An incomplete walk swaps in what it read plus the held list's videos under the directories it
/// could not read; one that could not read the root keeps the held list whole.
#[tokio::test]
async fn an_incomplete_walk_keeps_the_held_videos_under_what_it_could_not_read() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["a.mp4", "sub/b.mp4", "sub/c.mp4"] {
        touch(dir.path(), f);
    }
    let cat = catalog(dir.path(), None);
    assert_eq!(cat.samples("d").await.unwrap().len(), 3);
    let listing = |videos: &[&str]| Listing {
        samples: Some(Arc::new(samples(videos))),
        videos: videos.len() as u64,
        news: true,
    };
    let unreadable = |dir: &str| crate::dataset::WalkTrouble {
        unreadable_dirs: 1,
        first_unreadable: Some(format!("{dir}: Input/output error")),
        unreadable: Some(vec![dir.to_owned()]),
        ..Default::default()
    };
    // "sub" failed to read; "new.mp4" appeared at the root.
    let (listed, why) = cat.install_walk("d", listing(&["a.mp4", "new.mp4"]), &unreadable("sub"));
    assert_eq!(listed, Some(4));
    assert!(why
        .unwrap()
        .ends_with("the 2 videos listed under them before are kept"));
    let got = listed_videos(&cat).await;
    assert_eq!(got, vec!["a.mp4", "new.mp4", "sub/b.mp4", "sub/c.mp4"]);
    // The root failed: the held list stays whole.
    let (listed, why) = cat.install_walk("d", listing(&[]), &unreadable(""));
    assert_eq!(listed, None);
    assert!(why.unwrap().ends_with("the previous list is kept"));
    assert_eq!(cat.samples("d").await.unwrap().len(), 4);
}

/// A walked list of `videos`, sorted.
fn samples(videos: &[&str]) -> Samples {
    let mut b = SamplesBuilder::new();
    for v in videos {
        b.push(v, None, None, None);
    }
    b.finish_sorted()
}

/// The videos dataset "d" lists now.
async fn listed_videos(cat: &Arc<Catalog>) -> Vec<String> {
    let s = cat.samples("d").await.unwrap();
    s.iter().map(|s| s.video.to_owned()).collect()
}
