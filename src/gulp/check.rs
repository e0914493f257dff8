//! `vserve gulp-check DIR`: GulpIO's sanity checks plus JPEG validity of every record.
//!
//! Input: a GulpIO directory. Output: a [`Report`] listing every problem found (empty files, data files
//! whose size is not the sum of their records' lengths, records out of place, chunk files without their
//! pair, unparsable meta files, ids present in more than one chunk, videos without frames, records whose
//! bytes are not a complete JPEG or whose padding is not zero, an unparsable `label2idx.json`) and
//! warnings (temporary files an interrupted writer left). Reads only.

use std::collections::BTreeMap;
use std::path::Path;

use super::jpeg::Decoder;
use super::reader::{list_chunks, parse_meta};
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

/// Runs every check on `dir`.
pub fn check(dir: &Path) -> std::io::Result<Report> {
    let mut r = Report::default();
    let (datas, metas) = list_chunks(dir)?;
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
        let text = match std::fs::read_to_string(dir.join(&mname)) {
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
        let data = match std::fs::read(dir.join(&dname)) {
            Ok(d) => d,
            Err(e) => {
                r.problems.push(format!("{dname}: cannot read: {e}"));
                continue;
            }
        };
        if data.is_empty() {
            r.problems.push(format!("{dname}: empty file"));
        }
        let mut sum = 0u64;
        let mut end = 0u64;
        for (id, frames, meta) in &entries {
            r.videos += 1;
            labels.extend(super::stored_label(meta));
            if let Some(prev) = seen.insert(id.clone(), k) {
                r.problems
                    .push(format!("id {id:?} is in chunks {prev} and {k}"));
            }
            if frames.is_empty() {
                r.problems
                    .push(format!("{mname}: video {id:?} has no frames"));
            }
            for (i, f) in frames.iter().enumerate() {
                r.frames += 1;
                sum += f.length;
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
                if rec_end > data.len() as u64 {
                    r.problems.push(format!(
                        "{what}: record ends at byte {rec_end} past the end of the file ({} bytes)",
                        data.len()
                    ));
                    continue;
                }
                if data[range.end as usize..rec_end as usize]
                    .iter()
                    .any(|&b| b != 0)
                {
                    r.problems.push(format!("{what}: padding is not zero"));
                }
                if let Err(e) = decoder.decode(&data[range.start as usize..range.end as usize]) {
                    r.problems.push(format!("{what}: not a valid JPEG: {e}"));
                }
            }
        }
        let size = data.len() as u64;
        if !data.is_empty() && (sum != size || end != size) {
            r.problems.push(format!(
                "{dname}: file holds {size} bytes but its records' lengths sum to {sum} (last record ends at {end})"
            ));
        }
    }
    if let Ok(text) = std::fs::read_to_string(dir.join("label2idx.json")) {
        // The daemon ignores a file it cannot number every label with (see GulpDataset::samples).
        let problem = match super::reader::parse_label2idx(&text) {
            Ok(map) => super::reader::label2idx_problem(&map, labels.iter().map(String::as_str)),
            Err(why) => Some(why),
        };
        if let Some(why) = problem {
            r.problems.push(format!("label2idx.json: {why}"));
        }
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
    use crate::gulp::reader::{GulpDataset, GulpError};
    use crate::gulp::writer::ChunkWriter;

    #[test]
    fn duplicates_orphans_and_bad_records_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let jpeg = Encoder::new(90)
            .unwrap()
            .encode(&[100u8; 8 * 8 * 3], 8, 8)
            .unwrap();
        let meta = serde_json::json!({});
        for k in 0..2 {
            let mut w = ChunkWriter::create(dir.path(), k).unwrap();
            w.append("same", &meta, std::slice::from_ref(&jpeg))
                .unwrap();
            w.append(&format!("only{k}"), &meta, std::slice::from_ref(&jpeg))
                .unwrap();
            w.finish().unwrap();
        }
        let clean = check(dir.path()).unwrap();
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
        let r = check(dir.path()).unwrap();
        let text = r.problems.join("\n");
        assert!(text.contains("data_7.gulp: no meta_7.gmeta"), "{text}");
        assert!(text.contains("frame 0: not a valid JPEG"), "{text}");
        assert!(text.contains("records' lengths sum to"), "{text}");
    }
}
