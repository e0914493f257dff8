//! Writing GulpIO chunks atomically.
//!
//! Input: videos (an id, `meta_data[0]`, its frames' JPEG bytes) appended to an open [`ChunkWriter`].
//! Output: `data_<k>.gulp` and `meta_<k>.gmeta` in the output directory, in gulpio2's layout (records padded
//! with zeros to a multiple of 4 bytes, `frame_info` as `[offset, pad, length]`, `meta_data` a one-element
//! list).
//!
//! Invariant: a chunk becomes visible complete or not at all. Both files are written under temporary
//! names (`.data_<k>.gulp.tmp`, `.meta_<k>.gmeta.tmp`), fsynced, then renamed: the data file first, the
//! meta file last, and the directory fsynced. Readers find chunks through their meta file, so a crash at
//! any point leaves at most temporary files or a data file without its meta file, both of which readers
//! ignore, `vserve gulp-check` reports and `vserve ingest` removes when it resumes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{data_name, meta_name, pad_for};

/// Temporary name of a chunk file while it is written.
pub fn temp_name(final_name: &str) -> String {
    format!(".{final_name}.tmp")
}

/// Writes `bytes` to `dir/name` atomically (temporary file, fsync, rename, directory fsync).
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(temp_name(name));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// One chunk being written.
pub struct ChunkWriter {
    dir: PathBuf,
    number: u64,
    data: BufWriter<File>,
    offset: u64,
    /// The meta file's text so far (entries in append order), without the closing brace.
    meta: String,
    videos: usize,
}

impl ChunkWriter {
    /// Starts chunk `number` in `dir` (nothing visible until [`ChunkWriter::finish`]).
    pub fn create(dir: &Path, number: u64) -> std::io::Result<ChunkWriter> {
        let file = File::create(dir.join(temp_name(&data_name(number))))?;
        Ok(ChunkWriter {
            dir: dir.to_path_buf(),
            number,
            data: BufWriter::with_capacity(1 << 20, file),
            offset: 0,
            meta: String::from("{"),
            videos: 0,
        })
    }

    pub fn number(&self) -> u64 {
        self.number
    }

    /// Videos appended so far.
    pub fn videos(&self) -> usize {
        self.videos
    }

    /// Appends one video: its frames in temporal order and its meta data.
    pub fn append(
        &mut self,
        id: &str,
        meta: &serde_json::Value,
        frames: &[Vec<u8>],
    ) -> std::io::Result<()> {
        const ZEROS: [u8; 3] = [0; 3];
        let mut infos = Vec::with_capacity(frames.len());
        for jpeg in frames {
            let pad = pad_for(jpeg.len());
            self.data.write_all(jpeg)?;
            self.data.write_all(&ZEROS[..pad])?;
            let length = (jpeg.len() + pad) as u64;
            infos.push([self.offset, pad as u64, length]);
            self.offset += length;
        }
        let entry = serde_json::json!({ "frame_info": infos, "meta_data": [meta] });
        if self.videos > 0 {
            self.meta.push_str(", ");
        }
        // Serialising a String and a Value built from JSON cannot fail.
        self.meta
            .push_str(&serde_json::to_string(id).unwrap_or_default());
        self.meta.push_str(": ");
        self.meta
            .push_str(&serde_json::to_string(&entry).unwrap_or_default());
        self.videos += 1;
        Ok(())
    }

    /// Makes the chunk visible: data file synced and renamed, then the meta file.
    pub fn finish(self) -> std::io::Result<()> {
        let ChunkWriter {
            dir,
            number,
            data,
            mut meta,
            ..
        } = self;
        let file = data.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(
            dir.join(temp_name(&data_name(number))),
            dir.join(data_name(number)),
        )?;
        meta.push('}');
        write_atomic(&dir, &meta_name(number), meta.as_bytes())
    }

    /// Abandons the chunk, removing its temporary file.
    pub fn discard(self) {
        let path = self.dir.join(temp_name(&data_name(self.number)));
        drop(self.data);
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gulp::reader::GulpDataset;

    #[test]
    fn written_chunks_read_back_and_temporaries_stay_invisible() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ChunkWriter::create(dir.path(), 0).unwrap();
        let meta = serde_json::json!({"label": "cat", "fps": 10.0});
        // Not JPEG, but the reader's byte ranges do not care.
        w.append("a", &meta, &[vec![1, 2, 3, 4, 5], vec![6; 8]])
            .unwrap();
        w.append("b/c", &serde_json::json!({}), &[vec![7; 3]])
            .unwrap();
        // Unfinished: nothing a reader accepts.
        assert!(GulpDataset::open(dir.path()).unwrap().is_empty());
        w.finish().unwrap();
        let text = std::fs::read_to_string(dir.path().join("meta_0.gmeta")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["a"]["frame_info"],
            serde_json::json!([[0, 3, 8], [8, 0, 8]])
        );
        assert_eq!(v["b/c"]["frame_info"], serde_json::json!([[16, 1, 4]]));
        assert_eq!(v["a"]["meta_data"][0]["label"], "cat");
        assert_eq!(
            std::fs::metadata(dir.path().join("data_0.gulp"))
                .unwrap()
                .len(),
            20
        );
        let ds = GulpDataset::open(dir.path()).unwrap();
        assert_eq!(ds.ids().collect::<Vec<_>>(), vec!["a", "b/c"]);
        assert_eq!(ds.jpeg("a", 0).unwrap(), &[1, 2, 3, 4, 5]);
        assert_eq!(ds.jpeg("a", 1).unwrap(), &[6; 8]);
        assert_eq!(ds.jpeg("b/c", 0).unwrap(), &[7; 3]);
        assert!(ds.jpeg("a", 2).is_err());
        let samples = ds.samples().unwrap();
        assert_eq!(samples.get(0).label, Some("cat"));
        let w = ChunkWriter::create(dir.path(), 1).unwrap();
        w.discard();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    /// label2idx.json numbers the labels only when it names every one with distinct indices; used in
    /// part it gave two classes one index (a job would merge them), so such a file is ignored (with a
    /// log line) and gulp-check reports it.
    #[test]
    fn a_label2idx_that_cannot_number_every_label_is_ignored_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ChunkWriter::create(dir.path(), 0).unwrap();
        for (id, label) in [("a", "cat"), ("b", "dog"), ("c", "a,b")] {
            w.append(
                id,
                &serde_json::json!({ "label": label }),
                &[vec![1, 2, 3, 4]],
            )
            .unwrap();
        }
        w.finish().unwrap();
        let classes = |json: &str| {
            std::fs::write(dir.path().join("label2idx.json"), json).unwrap();
            let mut c = GulpDataset::open(dir.path())
                .unwrap()
                .samples()
                .unwrap()
                .classes();
            c.sort();
            c
        };
        let own = classes("{}");
        let indices: std::collections::BTreeSet<i64> = own.iter().map(|c| c.1).collect();
        assert_eq!(
            indices.len(),
            3,
            "without a usable file, three distinct indices: {own:?}"
        );
        let named = [
            ("a,b".to_owned(), 7),
            ("cat".to_owned(), 2),
            ("dog".to_owned(), 5),
        ];
        assert_eq!(classes(r#"{"cat": 2, "dog": 5, "a,b": 7}"#), named);
        for bad in [
            r#"{"cat": 2, "a,b": 0}"#,               // dog not named
            r#"{"cat": 2, "dog": 2, "a,b": 0}"#,     // one index twice
            r#"{"cat": 2, "dog": "two", "a,b": 0}"#, // not an integer
            "{not json",
        ] {
            assert_eq!(classes(bad), own, "{bad}");
            let report =
                crate::gulp::check::check(dir.path(), crate::gulp::reader::DEFAULT_MAX_PIXELS)
                    .unwrap();
            assert!(
                report
                    .problems
                    .iter()
                    .any(|p| p.starts_with("label2idx.json: ")),
                "{bad}: {:?}",
                report.problems
            );
        }
        std::fs::write(
            dir.path().join("label2idx.json"),
            r#"{"cat": 2, "dog": 5, "a,b": 7}"#,
        )
        .unwrap();
        let report =
            crate::gulp::check::check(dir.path(), crate::gulp::reader::DEFAULT_MAX_PIXELS).unwrap();
        assert!(
            !report
                .problems
                .iter()
                .any(|p| p.starts_with("label2idx.json")),
            "{:?}",
            report.problems
        );
    }

    /// A dataset with the labels of `rows` (id, meta data), each video one 4-byte record.
    fn labelled(rows: &[(&str, serde_json::Value)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ChunkWriter::create(dir.path(), 0).unwrap();
        for (id, meta) in rows {
            w.append(id, meta, &[vec![1, 2, 3, 4]]).unwrap();
        }
        w.finish().unwrap();
        dir
    }

    fn problems(dir: &Path) -> Vec<String> {
        let max = crate::gulp::reader::DEFAULT_MAX_PIXELS;
        let mut p = crate::gulp::check::check(dir, max).unwrap().problems;
        p.retain(|p| !p.contains("not a valid JPEG"));
        p
    }

    /// Labels that are all integers are their own label_index: a label -1 was served as -1, the index
    /// that means "no label" (and -2 as a class no loss accepts). Such samples are refused, naming the
    /// label, and gulp-check reports it; a label2idx.json numbering every label from 0 serves them.
    #[test]
    fn a_negative_integer_label_is_refused_unless_label2idx_numbers_it() {
        let dir = labelled(&[
            ("a", serde_json::json!({"label": 3})),
            ("b", serde_json::json!({"label": -1})),
            ("c", serde_json::json!({})),
        ]);
        let why = "label \"-1\" has label_index -1: indices must be >= 0 (-1 means \"no label\"; labels that are all integers are their own indices), so number the classes from 0 (or give a label2idx.json mapping every label to an index >= 0)";
        let err = GulpDataset::open(dir.path())
            .unwrap()
            .samples()
            .unwrap_err();
        assert_eq!(err, format!("gulp dataset {}: {why}", dir.path().display()));
        assert_eq!(problems(dir.path()), [why]);
        std::fs::write(dir.path().join("label2idx.json"), r#"{"3": 0, "-1": 1}"#).unwrap();
        let s = GulpDataset::open(dir.path()).unwrap().samples().unwrap();
        let rows: Vec<_> = s
            .iter()
            .map(|s| (s.video, s.label, s.label_index))
            .collect();
        assert_eq!(
            rows,
            [("a", Some("3"), 0), ("b", Some("-1"), 1), ("c", None, -1)]
        );
        assert_eq!(problems(dir.path()), Vec::<String>::new());
    }

    /// A label2idx.json giving a label a negative index numbered that class -1 (the "no label" index):
    /// the file is refused as any it cannot use is (ignored with a log line, the labels ranked), and
    /// gulp-check names the label.
    #[test]
    fn a_label2idx_with_a_negative_index_is_refused() {
        let dir = labelled(&[
            ("a", serde_json::json!({"label": "cat"})),
            ("b", serde_json::json!({"label": "dog"})),
        ]);
        std::fs::write(
            dir.path().join("label2idx.json"),
            r#"{"cat": -1, "dog": 0}"#,
        )
        .unwrap();
        let s = GulpDataset::open(dir.path()).unwrap().samples().unwrap();
        assert_eq!(s.classes(), [("cat".to_owned(), 0), ("dog".to_owned(), 1)]);
        assert_eq!(
            problems(dir.path()),
            [
                r#"label2idx.json: label "cat" has index -1: indices must be >= 0 (-1 means "no label")"#
            ]
        );
    }
}
