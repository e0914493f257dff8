//! `vserve gulp-check DIR`: GulpIO's sanity checks plus JPEG validity of every record.
//!
//! Input: a GulpIO directory. Output: a [`Report`] listing every problem found (empty files, data files
//! whose size is not the sum of their records' lengths, records out of place, chunk files without their
//! pair, unparsable meta files, ids present in more than one chunk or twice in one meta file, videos
//! without frames, records whose bytes are not a complete JPEG (or whose header claims more pixels than
//! the bound) or whose padding is not zero, a `label2idx.json` the daemon would ignore, a label whose
//! index would be negative) and
//! warnings (temporary files an interrupted writer left). Reads only.

use std::collections::BTreeMap;
use std::path::Path;

use super::jpeg::Decoder;
use super::reader::{list_chunks, misnamed_reason, parse_meta, MAX_RECORD};
use super::{data_name, meta_name};

#[derive(Debug, Default)]
pub struct Report {
    pub chunks: usize,
    pub videos: usize,
    pub frames: u64,
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Runs every check on `dir`; a record whose JPEG header claims more than `max_pixels` pixels (the
/// daemon's `--max-side` squared) is reported, not decoded.
pub fn check(dir: &Path, max_pixels: u64) -> std::io::Result<Report> {
    let mut r = Report::default();
    let list = list_chunks(dir)?;
    let (datas, metas) = (list.data, list.meta);
    r.problems
        .extend(list.misnamed.iter().map(|n| misnamed_reason(n)));
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            r.warnings.push(format!(
                "{name}: temporary file of an interrupted write (ignored by readers)"
            ));
        }
    }
    for k in &datas {
        if metas.binary_search(k).is_err() {
            r.problems
                .push(format!("{}: no {} beside it", data_name(*k), meta_name(*k)));
        }
    }
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut labels = std::collections::BTreeSet::new();
    let mut decoder = Decoder::new().map_err(|e| std::io::Error::other(e.to_string()))?;
    for k in metas {
        r.chunks += 1;
        let (dname, mname) = (data_name(k), meta_name(k));
        let read = crate::state::read_regular(&dir.join(&mname))
            .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other));
        let text = match read {
            Ok(t) => t,
            Err(e) => {
                r.problems.push(format!("{mname}: cannot read: {e}"));
                continue;
            }
        };
        if text.is_empty() {
            r.problems.push(format!("{mname}: empty file"));
            continue;
        }
        let entries = match parse_meta(&text) {
            Ok(e) => e,
            Err(e) => {
                r.problems
                    .push(format!("{mname}: not a valid meta file: {e}"));
                continue;
            }
        };
        // Read a record at a time: a data file may be gigabytes.
        let (data, meta) = match crate::state::open_regular(
            std::fs::OpenOptions::new().read(true),
            &dir.join(&dname),
        ) {
            Ok(d) => d,
            Err(e) => {
                r.problems.push(format!("{dname}: cannot read: {e}"));
                continue;
            }
        };
        let size = meta.len();
        if size == 0 {
            r.problems.push(format!("{dname}: empty file"));
        }
        let mut record = Vec::new();
        let mut sum = 0u64;
        let mut end = 0u64;
        for (id, frames, meta) in &entries {
            r.videos += 1;
            labels.extend(super::stored_label(meta));
            match seen.insert(id.clone(), k) {
                Some(prev) if prev == k => r
                    .problems
                    .push(format!("{mname}: id {id:?} is listed twice")),
                Some(prev) => r
                    .problems
                    .push(format!("id {id:?} is in chunks {prev} and {k}")),
                None => {}
            }
            if frames.is_empty() {
                r.problems
                    .push(format!("{mname}: video {id:?} has no frames"));
            }
            for (i, f) in frames.iter().enumerate() {
                r.frames += 1;
                sum = sum.saturating_add(f.length);
                end = end.max(f.offset.saturating_add(f.length));
                let what = format!("{dname}: video {id:?} frame {i}");
                if f.pad > 3 || f.length % 4 != 0 {
                    r.problems.push(format!(
                        "{what}: record (offset {}, pad {}, length {}) is not padded to 4 bytes",
                        f.offset, f.pad, f.length
                    ));
                }
                let Some(range) = f.jpeg_range() else {
                    r.problems.push(format!(
                        "{what}: inconsistent record (offset {}, pad {}, length {})",
                        f.offset, f.pad, f.length
                    ));
                    continue;
                };
                let rec_end = f.offset.saturating_add(f.length);
                if rec_end > size {
                    r.problems.push(format!(
                        "{what}: record ends at byte {rec_end} past the end of the file ({size} bytes)"
                    ));
                    continue;
                }
                if f.length > MAX_RECORD {
                    r.problems.push(format!(
                        "{what}: record of {} bytes, more than the {MAX_RECORD} a frame may take",
                        f.length
                    ));
                    continue;
                }
                record.clear();
                record.resize(f.length as usize, 0);
                if let Err(e) =
                    std::os::unix::fs::FileExt::read_exact_at(&data, &mut record, f.offset)
                {
                    r.problems.push(format!("{what}: cannot read: {e}"));
                    continue;
                }
                let jpeg_len = (range.end - range.start) as usize;
                if record[jpeg_len..].iter().any(|&b| b != 0) {
                    r.problems.push(format!("{what}: padding is not zero"));
                }
                if let Err(e) = decoder.decode(&record[..jpeg_len], max_pixels) {
                    r.problems.push(format!("{what}: not a valid JPEG: {e}"));
                }
            }
        }
        if size != 0 && (sum != size || end != size) {
            r.problems.push(format!(
                "{dname}: file holds {size} bytes but its records' lengths sum to {sum} (last record ends at {end})"
            ));
        }
    }
    // Numbered as the daemon numbers them (GulpDataset::samples): a label2idx.json it ignores and a
    // label whose index would be negative are problems.
    let label2idx = std::fs::read_to_string(dir.join("label2idx.json"))
        .ok()
        .map(|text| super::reader::parse_label2idx(&text));
    let samples = crate::manifest::Samples::from_labeled(
        labels
            .into_iter()
            .map(|l| (String::new(), Some(l)))
            .collect(),
    );
    let (samples, ignored) = super::reader::number_labels(samples, label2idx.as_ref());
    if let Some(why) = ignored {
        r.problems.push(format!("label2idx.json: {why}"));
    }
    if let Some(why) = samples.negative_label() {
        r.problems.push(format!(
            "{why} (or give a label2idx.json mapping every label to an index >= 0)"
        ));
    }
    if r.chunks == 0 {
        r.problems
            .push(format!("{}: no meta_<k>.gmeta files", dir.display()));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gulp::jpeg::Encoder;
    use crate::gulp::reader::{GulpDataset, GulpError, DEFAULT_MAX_PIXELS};
    use crate::gulp::writer::ChunkWriter;

    /// An 8x8 grey JPEG record.
    fn grey_8x8() -> Vec<u8> {
        Encoder::new(90)
            .unwrap()
            .encode(&[100u8; 8 * 8 * 3], 8, 8)
            .unwrap()
    }

    #[test]
    fn duplicates_orphans_and_bad_records_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let jpeg = grey_8x8();
        let meta = serde_json::json!({});
        for k in 0..2 {
            let mut w = ChunkWriter::create(dir.path(), k).unwrap();
            w.append("same", &meta, std::slice::from_ref(&jpeg))
                .unwrap();
            w.append(&format!("only{k}"), &meta, std::slice::from_ref(&jpeg))
                .unwrap();
            w.finish().unwrap();
        }
        let clean = check(dir.path(), DEFAULT_MAX_PIXELS).unwrap();
        assert_eq!((clean.chunks, clean.videos, clean.frames), (2, 4, 4));
        assert_eq!(clean.problems, vec![r#"id "same" is in chunks 0 and 1"#]);
        let ds = GulpDataset::open(dir.path()).unwrap();
        assert!(matches!(ds.entry("same"), Err(GulpError::Corrupt { .. })));
        assert!(ds.entry("only0").is_ok() && ds.entry("only1").is_ok());
        assert!(matches!(ds.entry("nope"), Err(GulpError::NotFound { .. })));

        std::fs::write(dir.path().join("data_7.gulp"), b"orphan").unwrap();
        let mut data = std::fs::read(dir.path().join("data_1.gulp")).unwrap();
        data[0] = 0;
        data.extend_from_slice(&[0; 4]);
        std::fs::write(dir.path().join("data_1.gulp"), data).unwrap();
        let r = check(dir.path(), DEFAULT_MAX_PIXELS).unwrap();
        let text = r.problems.join("\n");
        assert!(text.contains("data_7.gulp: no meta_7.gmeta"), "{text}");
        assert!(text.contains("frame 0: not a valid JPEG"), "{text}");
        assert!(text.contains("records' lengths sum to"), "{text}");
    }

    /// GulpIO numbers chunks without leading zeros. A `meta_007.gmeta` was read as `meta_7.gmeta` (a file
    /// that is not there), and a stray `meta_00.gmeta` beside `meta_0.gmeta` read chunk 0 twice (every id
    /// "in chunks 0 and 0"). Such names are now reported by name and not read.
    #[test]
    fn chunk_files_numbered_with_leading_zeros_are_reported_not_misread() {
        let dir = tempfile::tempdir().unwrap();
        let jpeg = grey_8x8();
        let mut w = ChunkWriter::create(dir.path(), 0).unwrap();
        w.append("a", &serde_json::json!({}), std::slice::from_ref(&jpeg))
            .unwrap();
        w.finish().unwrap();
        std::fs::copy(
            dir.path().join("meta_0.gmeta"),
            dir.path().join("meta_00.gmeta"),
        )
        .unwrap();
        std::fs::copy(
            dir.path().join("data_0.gulp"),
            dir.path().join("data_007.gulp"),
        )
        .unwrap();
        let r = check(dir.path(), DEFAULT_MAX_PIXELS).unwrap();
        let text = r.problems.join("\n");
        assert_eq!(r.problems.len(), 2, "{text}");
        assert!(
            text.contains("data_007.gulp: not a GulpIO chunk name"),
            "{text}"
        );
        assert!(
            text.contains("meta_00.gmeta: not a GulpIO chunk name"),
            "{text}"
        );
        assert!(!text.contains("chunks 0 and 0"), "{text}");
        let ds = GulpDataset::open(dir.path()).unwrap();
        assert!(ds.entry("a").is_ok());
        assert_eq!(ds.broken.len(), 2, "{:?}", ds.broken);
    }

    /// A record's JPEG header claiming a picture over the bound is reported, not decoded (gulp-check took
    /// 1.2 GB for a 12 KB record claiming 20000x20000); the index refuses a video whose frames are over the
    /// daemon's bound (INVALID_ARGUMENT), and a data file is read a record at a time.
    #[test]
    fn records_claiming_enormous_pictures_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let good = Encoder::new(90)
            .unwrap()
            .encode(&[100u8; 16 * 8 * 3], 16, 8)
            .unwrap();
        let huge = crate::gulp::jpeg::tests::claiming_65000(&good);
        let mut w = ChunkWriter::create(dir.path(), 0).unwrap();
        let meta = serde_json::json!({});
        w.append("huge_first", &meta, &[huge.clone(), good.clone()])
            .unwrap();
        w.append("fine", &meta, std::slice::from_ref(&good))
            .unwrap();
        w.finish().unwrap();
        let r = check(dir.path(), DEFAULT_MAX_PIXELS).unwrap();
        let text = r.problems.join("\n");
        assert_eq!(r.problems.len(), 1, "{text}");
        assert!(
            text.contains(
                "\"huge_first\" frame 0: not a valid JPEG: its header claims 65000x65000"
            ),
            "{text}"
        );
        let ds = GulpDataset::open(dir.path()).unwrap();
        let err = ds.index("huge_first").unwrap_err();
        assert!(
            matches!(
                err,
                GulpError::TooLarge {
                    width: 65000,
                    height: 65000,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(ds.index("fine").unwrap().width, 16);
        let small = GulpDataset::open(dir.path()).unwrap().with_max_pixels(100);
        assert!(matches!(
            small.index("fine"),
            Err(GulpError::TooLarge { .. })
        ));
    }

    /// A FIFO at a chunk's path (at start-up, or renamed over a served chunk) fails its videos at once:
    /// data files are opened per run, and a blocking open of a FIFO held the thread forever.
    #[test]
    fn a_fifo_in_place_of_a_chunk_blocks_nothing() {
        let fifo = |p: &Path| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path; mkfifo reads it only.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        };
        let dir = tempfile::tempdir().unwrap();
        let jpeg = grey_8x8();
        for k in 0..2 {
            let mut w = ChunkWriter::create(dir.path(), k).unwrap();
            w.append(
                &format!("v{k}"),
                &serde_json::json!({}),
                std::slice::from_ref(&jpeg),
            )
            .unwrap();
            w.finish().unwrap();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || {
            std::fs::remove_file(path.join("data_0.gulp")).unwrap();
            fifo(&path.join("data_0.gulp"));
            let ds = GulpDataset::open(&path).unwrap();
            let at_start = ds.jpeg("v0", 0).map(|_| ());
            let served = ds.jpeg("v1", 0).map(|b| b.len());
            std::fs::remove_file(path.join("data_1.gulp")).unwrap();
            fifo(&path.join("data_1.gulp"));
            let renamed_over = ds.jpeg("v1", 0).map(|_| ());
            let report = check(&path, DEFAULT_MAX_PIXELS).unwrap();
            let _ = tx.send((at_start, served, renamed_over, report.problems));
        });
        let (at_start, served, renamed_over, problems) = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a FIFO chunk blocked a read");
        assert!(
            matches!(at_start, Err(GulpError::Corrupt { .. })),
            "{at_start:?}"
        );
        assert_eq!(served.unwrap(), jpeg.len());
        let err = renamed_over.unwrap_err().to_string();
        assert!(err.contains("FIFO"), "{err}");
        assert!(
            problems.iter().any(|p| p.contains("data_0.gulp")),
            "{problems:?}"
        );
    }

    /// A stored frame rate maps time to frames as ⌊t·fps⌋ across the whole range a dataset may store
    /// (0.0004 gave the time base 1000/0, every time frame 0; 20000 was read back as 25), in a reduced
    /// time base; a rate outside the range is served at 25.
    #[test]
    fn stored_frame_rates_give_exact_time_bases() {
        let dir = tempfile::tempdir().unwrap();
        let jpeg = grey_8x8();
        let cases: [(f64, (i32, i32)); 6] = [
            (25.0, (1, 25)),
            (29.97, (100, 2997)),
            (0.0015, (2000, 3)),
            (2500.5, (2, 5001)),
            (10_000.0, (1, 10_000)),
            (0.0004, (1, 25)),
        ];
        let mut w = ChunkWriter::create(dir.path(), 0).unwrap();
        for (i, (fps, _)) in cases.iter().enumerate() {
            w.append(
                &format!("v{i}"),
                &serde_json::json!({ "fps": fps }),
                std::slice::from_ref(&jpeg),
            )
            .unwrap();
        }
        w.finish().unwrap();
        let ds = GulpDataset::open(dir.path()).unwrap();
        for (i, (fps, tb)) in cases.iter().enumerate() {
            assert_eq!(
                ds.index(&format!("v{i}")).unwrap().time_base,
                *tb,
                "fps {fps}"
            );
        }
    }

    /// An id listed twice in one meta file (a JSON object with a key twice) was merged by the parser, the
    /// last entry winning, unreported. gulp-check now reports it and the daemon serves neither entry
    /// (DATA_LOSS), as for an id in two chunks.
    #[test]
    fn an_id_listed_twice_in_one_meta_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let jpeg = grey_8x8();
        let mut w = ChunkWriter::create(dir.path(), 0).unwrap();
        for id in ["twice", "once", "twice"] {
            w.append(id, &serde_json::json!({}), std::slice::from_ref(&jpeg))
                .unwrap();
        }
        w.finish().unwrap();
        let r = check(dir.path(), DEFAULT_MAX_PIXELS).unwrap();
        assert_eq!(r.problems, [r#"meta_0.gmeta: id "twice" is listed twice"#]);
        assert_eq!(r.videos, 3);
        let ds = GulpDataset::open(dir.path()).unwrap();
        assert_eq!(
            ds.entry("twice").unwrap_err(),
            GulpError::Corrupt {
                id: "twice".into(),
                reason: "id is listed twice in meta_0.gmeta".into()
            }
        );
        assert!(ds.entry("once").is_ok());
    }

    /// gulp-check bounded decoded frames at 8192² whatever the daemon's --max-side; it now takes the
    /// bound (`--max-side`, the daemon's flag and default).
    #[test]
    fn the_pixel_bound_is_the_callers() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ChunkWriter::create(dir.path(), 0).unwrap();
        w.append("v", &serde_json::json!({}), &[grey_8x8()])
            .unwrap();
        w.finish().unwrap();
        assert!(check(dir.path(), 64).unwrap().ok());
        assert_eq!(
            check(dir.path(), 49).unwrap().problems,
            [
                r#"data_0.gulp: video "v" frame 0: not a valid JPEG: its header claims 8x8, more than the 49 pixels a frame may have (--max-side squared)"#
            ]
        );
        let args = |a: &[&str]| {
            use clap::Parser;
            match crate::cli::Cli::try_parse_from(a).map(|c| c.command) {
                Ok(Some(crate::cli::Command::GulpCheck(g))) => Ok(g.max_side),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.kind()),
            }
        };
        assert_eq!(args(&["vserve", "gulp-check", "d"]), Ok(8192));
        assert_eq!(
            args(&["vserve", "gulp-check", "d", "--max-side", "7"]),
            Ok(7)
        );
        assert_eq!(
            args(&["vserve", "gulp-check", "d", "--max-side", "0"]),
            Err(clap::error::ErrorKind::ValueValidation)
        );
    }
}
