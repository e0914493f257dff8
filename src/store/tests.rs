use super::*;
use crate::index::{FrameEntry, IndexMethod, SeekMode};

fn table(pts: &[i64], keys: &[usize]) -> VideoIndex {
    VideoIndex {
        stream: 3,
        codec: "h264".into(),
        pixel_format: "yuv420p".into(),
        width: 320,
        height: 180,
        rotation: 90,
        mirror: true,
        time_base: (1, 90000),
        avg_fps: 29.97,
        frames: pts
            .iter()
            .enumerate()
            .map(|(i, &p)| FrameEntry {
                pts: p,
                duration: pts.get(i + 1).map_or(3003, |n| n - p),
                key: keys.contains(&i),
                stated_duration: if i == 2 { 0 } else { 3003 },
            })
            .collect(),
        keyframes: keys.to_vec().into(),
        declared_frames: 7,
        seek: SeekMode::FromStart,
        method: IndexMethod::DecodeScan,
        h264_nal_length: Some(4),
        damaged: true,
    }
}

fn record(path: &str, health: Health, t: Option<VideoIndex>) -> Record {
    let t = t.map(Arc::new);
    Record {
        key: Key {
            path: path.into(),
            size: 1234,
            mtime_ns: 1_700_000_000_123_456_789,
            stream: None,
        },
        health,
        decode_table: true,
        table: t,
        written_ms: 42,
        content: 0x5eed,
        node: crate::dataset::FileNode {
            dev: 0x801,
            ino: 123_456,
            ctime_ns: 1_700_000_001_000_000_007,
        },
    }
}

#[test]
fn records_round_trip_and_regular_columns_cost_nothing_per_frame() {
    let damaged = Health::Damaged {
        frames: 5,
        first_bad_frame: 3,
        bad_ranges: vec![(3, 4)],
        reason: "decoder rejected a packet".into(),
    };
    // Irregular pts (i32 offsets), a wide column, and a linear one.
    let mut t = table(&[0, 3003, 6006, 9999, 12012], &[0, 3]);
    t.frames.make_mut()[4].stated_duration = i64::MAX;
    let r = record("/v/a b.mp4", damaged, Some(t));
    let back = format::decode(&format::encode(&r)).unwrap();
    assert_eq!(back, r);
    for h in [
        Health::Unchecked,
        Health::Ok { frames: 9 },
        Health::Unreadable {
            reason: "no video stream".into(),
            corrupt: false,
        },
        Health::Quarantined {
            reason: "crashed the daemon".into(),
        },
    ] {
        let r = record("/v/x.mkv", h, None);
        assert_eq!(format::decode(&format::encode(&r)).unwrap(), r);
    }
    // Constant frame rate: no per-frame numbers but the key bits.
    let n = 18_000;
    let pts: Vec<i64> = (0..n).map(|k| k * 3003).collect();
    let mut cfr = table(&pts, &[0, 300, 600]);
    cfr.frames
        .make_mut()
        .iter_mut()
        .for_each(|f| f.stated_duration = 3003);
    let bytes = format::encode(&record(
        "/v/long.mp4",
        Health::Ok { frames: 18_000 },
        Some(cfr),
    ));
    assert!(bytes.len() < 2_700, "{} bytes", bytes.len());
}

#[test]
fn every_flipped_bit_and_truncation_is_refused() {
    let r = record(
        "/v/a.mp4",
        Health::Ok { frames: 3 },
        Some(table(&[0, 10, 25], &[0])),
    );
    let bytes = format::encode(&r);
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x10;
        assert!(
            format::decode(&bad).is_err(),
            "bit flip at byte {i} accepted"
        );
    }
    for len in 0..bytes.len() {
        assert!(
            format::decode(&bytes[..len]).is_err(),
            "truncation to {len}"
        );
    }
    let mut v6 = bytes.clone();
    v6[8] = 6;
    assert_eq!(format::decode(&v6), Err(format::FormatError::Version(6)));
    // Version 4's checks called an MP4 cut short not media: its "unreadable, not corrupt" verdicts are
    // read as unchecked (judged again); its corrupt ones, and version 5's, are kept.
    for (corrupt, version, kept) in [(false, 4, false), (true, 4, true), (false, 5, true)] {
        let health = Health::Unreadable {
            reason: "cannot open: Invalid data found when processing input".into(),
            corrupt,
        };
        let mut b = format::encode(&record("/v/cut.mp4", health.clone(), None));
        b[8] = version;
        let want = if kept { health } else { Health::Unchecked };
        assert_eq!(
            format::decode(&b).unwrap().health,
            want,
            "v{version}, corrupt {corrupt}"
        );
    }
    // A version 1 record keeps its health; its table, which could not say whether the display matrix
    // mirrors, is built again. Neither version 1 nor 2 knew the content sample (0: unknown).
    let mut v1 = bytes.clone();
    v1[8] = 1;
    let old = format::decode(&v1).unwrap();
    assert_eq!(old.health, r.health);
    assert_eq!(old.key, r.key);
    assert!(old.table.is_none());
    assert_eq!(old.content, 0);
    // Versions 2 and 3 made up the timestamps of frames with no pts in tables made by decoding (as
    // `r`'s): such a table is built again, its health kept; one made by the packet scan is kept.
    let mut by_packets = r.clone();
    let mut t = (**by_packets.table.as_ref().unwrap()).clone();
    t.method = crate::index::IndexMethod::PacketScan;
    by_packets.table = Some(Arc::new(t));
    let packets = format::encode(&by_packets);
    for version in [2, 3] {
        let mut old = bytes.clone();
        old[8] = version;
        let old = format::decode(&old).unwrap();
        assert_eq!((old.table, &old.health), (None, &r.health), "v{version}");
        let mut old = packets.clone();
        old[8] = version;
        let old = format::decode(&old).unwrap();
        assert_eq!(old.table, by_packets.table, "v{version}");
        assert_eq!(old.content, if version == 2 { 0 } else { r.content });
        assert_eq!(
            old.node,
            crate::dataset::FileNode::default(),
            "unknown before v4"
        );
    }
    assert_eq!(
        format::decode(b"PK\x03\x04 not ours at all, a zip or anything"),
        Err(format::FormatError::Magic)
    );
    assert_eq!(format::crc32(b"123456789"), 0xCBF4_3926);
}

#[test]
fn lookups_check_identity_and_ignore_what_they_cannot_trust() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let store = Store::open(&state, 1 << 20);
    let r = record(
        "/v/a.mp4",
        Health::Ok { frames: 3 },
        Some(table(&[0, 10, 25], &[0])),
    );
    assert_eq!(store.get(&r.key), None);
    store.put(&r).unwrap();
    let got = store.get(&r.key).unwrap();
    assert_eq!((got.health, got.table), (r.health.clone(), r.table.clone()));
    // Another version of the file, another stream: misses.
    let mut newer = r.key.clone();
    newer.mtime_ns += 1;
    assert_eq!(store.get(&newer), None);
    let mut other_stream = r.key.clone();
    other_stream.stream = Some(0);
    assert_eq!(store.get(&other_stream), None);
    // A record of another video placed where this one's lives (a foreign file): ignored.
    let other = record("/v/b.mp4", Health::Ok { frames: 3 }, None);
    std::fs::write(store.path_of(&r.key), format::encode(&other)).unwrap();
    assert_eq!(store.get(&r.key), None);
    // Garbage: ignored; a put replaces it.
    std::fs::write(store.path_of(&r.key), b"garbage").unwrap();
    assert_eq!(store.get(&r.key), None);
    store.put(&r).unwrap();
    assert!(store.get(&r.key).is_some());
    // Quarantine keeps the table.
    store
        .set_health(
            &r.key,
            Health::Quarantined {
                reason: "SIGSEGV in the decoder".into(),
            },
        )
        .unwrap();
    let q = store.get(&r.key).unwrap();
    assert_eq!(q.health.status(), "quarantined");
    assert_eq!(q.table, r.table);
    // Safe to delete.
    std::fs::remove_dir_all(state.path(DIR)).unwrap();
    assert_eq!(store.get(&r.key), None);
    store.put(&r).unwrap();
    assert!(store.get(&r.key).is_some());
}

#[test]
fn tables_are_held_packed_and_long_records_mapped() {
    // Irregular pts and durations (i32 offsets): 20,000 frames, a ~240 KB record.
    let pts: Vec<i64> = (0..20_000).map(|k| k * 3003 + (k % 7) * 11).collect();
    let keys: Vec<usize> = (0..20_000).step_by(30).collect();
    let mut t = table(&pts, &keys);
    t.seek = SeekMode::ByPts;
    let owned_bytes = t.approx_bytes();
    let packed = format::pack(t.clone());
    assert_eq!(packed, t, "packing changes no frame");
    assert!(packed.frames.is_packed() && !packed.frames.is_mapped());
    assert!(
        packed.approx_bytes() * 2 < owned_bytes,
        "{} vs {owned_bytes}",
        packed.approx_bytes()
    );
    assert_eq!(packed.keyframe_before(65), 60);
    assert_eq!(packed.frame_of_pts(pts[12_345]), Some(12_345));

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&StateDir::open(dir.path()).unwrap(), 1 << 30);
    let long = record(
        "/v/long.mp4",
        Health::Ok { frames: 20_000 },
        Some(t.clone()),
    );
    let short = record(
        "/v/short.mp4",
        Health::Ok { frames: 3 },
        Some(table(&[0, 10, 25], &[0])),
    );
    store.put(&long).unwrap();
    store.put(&short).unwrap();
    assert!(std::fs::metadata(store.path_of(&long.key)).unwrap().len() >= MAP_AT);
    let got = store.get(&long.key).unwrap().table.unwrap();
    assert!(got.frames.is_mapped(), "a long record is mapped");
    assert_eq!(*got, t);
    // Mapped: the heap holds no frame, the cache weighs the mapping (8 KiB).
    assert_eq!(got.frames.heap_bytes(), 0);
    assert!(got.approx_bytes() < 8192 + 512, "{}", got.approx_bytes());
    // Replacing the record (rename) leaves the mapped table intact.
    store.put(&short).unwrap();
    store.put(&long).unwrap();
    assert_eq!(got.frames.at(19_999).pts, pts[19_999]);
    let small = store.get(&short.key).unwrap().table.unwrap();
    assert!(small.frames.is_packed() && !small.frames.is_mapped());
    assert_eq!(small.frames, short.table.as_ref().unwrap().frames);
}

#[test]
fn the_bound_evicts_the_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    // A few hundred bytes, counted as the block they take.
    let len = format::encode(&record("/v/0000.mp4", Health::Ok { frames: 3 }, None)).len() as u64;
    assert!(len < 1000, "{len}");
    let one = on_disk(len);
    assert_eq!(one, 4096);
    let store = Store::open(&state, one * 10);
    let keys: Vec<Key> = (0..30)
        .map(|i| record(&format!("/v/{i:04}.mp4"), Health::Ok { frames: 3 }, None).key)
        .collect();
    let t0 = SystemTime::now() - std::time::Duration::from_secs(1000);
    for (i, k) in keys.iter().enumerate() {
        store
            .put(&record(
                &k.path.to_string_lossy(),
                Health::Ok { frames: 3 },
                None,
            ))
            .unwrap();
        // Distinct ages without sleeping: record i was written at t0 + i s.
        std::fs::File::options()
            .write(true)
            .open(store.path_of(k))
            .unwrap()
            .set_modified(t0 + std::time::Duration::from_secs(i as u64))
            .unwrap();
        if i == 5 {
            // Read (and so refreshed) just before the bound is reached.
            assert!(store.get(&keys[0]).is_some());
        }
    }
    assert!(
        store.bytes_used() <= one * 10,
        "{} > {}",
        store.bytes_used(),
        one * 10
    );
    let kept: Vec<usize> = (0..30).filter(|&i| store.get(&keys[i]).is_some()).collect();
    // The newest writes stay, and the record read recently outlived its contemporaries.
    assert!(kept.contains(&29) && kept.contains(&0), "{kept:?}");
    assert!(!kept.contains(&1) && !kept.contains(&10), "{kept:?}");
}
