//! A dataset's sample list: a manifest's rows, or the video files under its root.
//!
//! Input: a manifest file (CSV or JSON Lines) or a dataset root. Output: [`Samples`], the ordered list
//! a stream samples from, each with a video path relative to the root, an optional label and optional
//! start/end seconds that trim the video.
//!
//! Formats:
//! - CSV (`.csv`): a header naming the columns `path` (or `video`), `label`, `start`, `end` in any order
//!   (other columns ignored); without a header the columns are `path[,label[,start,end]]`. Fields may be
//!   double-quoted (`""` is a quote inside one).
//! - JSON Lines (`.jsonl`, `.ndjson`): one object per line with `path` (or `video`) and optional
//!   `label` (string or number), `start`, `end`. Blank lines are skipped.
//!
//! Invariants: rows keep the file's order; a scan lists files sorted by path, so the list (and every
//! epoch's order derived from it) is the same on every host. Paths are not resolved here: the dataset
//! confines them when a stream reads them. Label indices: when every label is an integer, the integer;
//! otherwise the label's position in the sorted set of distinct labels; -1 without a label.

use std::collections::BTreeSet;
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub video: String,
    pub label: Option<String>,
    pub label_index: i64,
    pub start: Option<f64>,
    pub end: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    pub samples: Vec<Sample>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ManifestError {
    #[error("cannot read manifest {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("manifest {path} line {line}: {reason}")]
    Parse {
        path: String,
        line: usize,
        reason: String,
    },
}

impl Samples {
    /// Reads a manifest; the format follows the extension (`.jsonl`/`.ndjson`, else CSV).
    pub fn from_manifest(path: &Path) -> Result<Samples, ManifestError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ManifestError::Io {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let rows = if ext == "jsonl" || ext == "ndjson" {
            parse_jsonl(&text, &shown)?
        } else {
            parse_csv(&text, &shown)?
        };
        Ok(Samples::with_labels(rows))
    }

    /// Lists the video files under `root` (by extension, symlinks not followed), sorted.
    pub fn scan(root: &Path) -> Samples {
        Samples::from_paths(root, crate::dataset::walk_videos(root))
    }

    /// Samples for video files found under `root` (sorted by relative path; no labels).
    pub fn from_paths(root: &Path, paths: Vec<std::path::PathBuf>) -> Samples {
        let mut found: Vec<String> = paths
            .iter()
            .filter_map(|p| p.strip_prefix(root).ok()?.to_str().map(str::to_owned))
            .collect();
        found.sort();
        Samples::with_labels(
            found
                .into_iter()
                .map(|video| Row {
                    video,
                    label: None,
                    start: None,
                    end: None,
                })
                .collect(),
        )
    }

    /// Samples from (video, label) pairs in the given order, label indices by the manifest rule.
    pub fn from_labeled(rows: Vec<(String, Option<String>)>) -> Samples {
        Samples::with_labels(
            rows.into_iter()
                .map(|(video, label)| Row {
                    video,
                    label,
                    start: None,
                    end: None,
                })
                .collect(),
        )
    }

    fn with_labels(rows: Vec<Row>) -> Samples {
        let labels: BTreeSet<&str> = rows.iter().filter_map(|r| r.label.as_deref()).collect();
        let all_integers = labels.iter().all(|l| l.parse::<i64>().is_ok());
        let index_of = |label: &Option<String>| -> i64 {
            match label {
                None => -1,
                Some(l) if all_integers => l.parse().unwrap_or(-1),
                Some(l) => labels
                    .iter()
                    .position(|x| *x == l.as_str())
                    .map_or(-1, |p| p as i64),
            }
        };
        let samples = rows
            .iter()
            .map(|r| Sample {
                video: r.video.clone(),
                label: r.label.clone(),
                label_index: index_of(&r.label),
                start: r.start,
                end: r.end,
            })
            .collect();
        Samples { samples }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Each distinct label with its label index, sorted by label.
    pub fn classes(&self) -> Vec<(String, i64)> {
        let mut seen: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
        for s in &self.samples {
            if let Some(l) = &s.label {
                seen.entry(l.as_str()).or_insert(s.label_index);
            }
        }
        seen.into_iter().map(|(l, i)| (l.to_owned(), i)).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

struct Row {
    video: String,
    label: Option<String>,
    start: Option<f64>,
    end: Option<f64>,
}

fn seconds(v: &str, what: &str) -> Result<Option<f64>, String> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(Some(s)),
        _ => Err(format!("{what} {v:?} is not a number of seconds >= 0")),
    }
}

fn check_row(row: &Row) -> Result<(), String> {
    if row.video.is_empty() {
        return Err("empty path".into());
    }
    if let (Some(s), Some(e)) = (row.start, row.end) {
        if e <= s {
            return Err(format!("end {e} is not after start {s}"));
        }
    }
    Ok(())
}

/// Splits one CSV line into fields, honouring double quotes.
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    cur.push('"');
                } else {
                    quoted = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' && cur.trim().is_empty() && !was_quoted {
            cur.clear();
            quoted = true;
            was_quoted = true;
        } else if c == ',' {
            fields.push(if was_quoted {
                std::mem::take(&mut cur)
            } else {
                std::mem::take(&mut cur).trim().to_owned()
            });
            was_quoted = false;
        } else {
            cur.push(c);
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    fields.push(if was_quoted {
        cur
    } else {
        cur.trim().to_owned()
    });
    Ok(fields)
}

fn parse_csv(text: &str, path: &str) -> Result<Vec<Row>, ManifestError> {
    let err = |line: usize, reason: String| ManifestError::Parse {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut rows = Vec::new();
    // Column positions of path, label, start, end.
    let mut columns: Option<[Option<usize>; 4]> = None;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = raw.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let fields = csv_fields(line).map_err(|r| err(line_no, r))?;
        if columns.is_none() {
            let names: Vec<String> = fields.iter().map(|f| f.to_ascii_lowercase()).collect();
            let find = |alts: &[&str]| names.iter().position(|n| alts.contains(&n.as_str()));
            if let Some(p) = find(&["path", "video"]) {
                columns = Some([
                    Some(p),
                    find(&["label"]),
                    find(&["start", "time_start"]),
                    find(&["end", "time_end"]),
                ]);
                continue;
            }
            columns = Some([Some(0), Some(1), Some(2), Some(3)]);
        }
        let [p, l, s, e] = columns.unwrap_or_default();
        let get = |c: Option<usize>| c.and_then(|c| fields.get(c)).map(|s| s.as_str());
        let row = Row {
            video: get(p).unwrap_or("").to_owned(),
            label: get(l).filter(|l| !l.is_empty()).map(str::to_owned),
            start: seconds(get(s).unwrap_or(""), "start").map_err(|r| err(line_no, r))?,
            end: seconds(get(e).unwrap_or(""), "end").map_err(|r| err(line_no, r))?,
        };
        check_row(&row).map_err(|r| err(line_no, r))?;
        rows.push(row);
    }
    Ok(rows)
}

fn parse_jsonl(text: &str, path: &str) -> Result<Vec<Row>, ManifestError> {
    let err = |line: usize, reason: String| ManifestError::Parse {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| err(line_no, e.to_string()))?;
        let obj = v
            .as_object()
            .ok_or_else(|| err(line_no, "not a JSON object".into()))?;
        let video = obj
            .get("path")
            .or_else(|| obj.get("video"))
            .and_then(|v| v.as_str())
            .ok_or_else(|| err(line_no, "no \"path\" string".into()))?
            .to_owned();
        let label = match obj.get("label") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            Some(other) => {
                return Err(err(
                    line_no,
                    format!("label {other} is not a string or number"),
                ))
            }
        };
        let num = |key: &str| -> Result<Option<f64>, ManifestError> {
            match obj.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => match v.as_f64() {
                    Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(s)),
                    _ => Err(err(
                        line_no,
                        format!("{key} {v} is not a number of seconds >= 0"),
                    )),
                },
            }
        };
        let row = Row {
            video,
            label,
            start: num("start")?,
            end: num("end")?,
        };
        check_row(&row).map_err(|r| err(line_no, r))?;
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn csv_with_header_quotes_and_trims() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "m.csv",
            "label,path,start,end\n\"playing guitar, loudly\",a/x.mp4,1.5,4\nswimming,b.mp4,,\r\n\n",
        );
        let s = Samples::from_manifest(&p).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s.samples[0].video, "a/x.mp4");
        assert_eq!(
            s.samples[0].label.as_deref(),
            Some("playing guitar, loudly")
        );
        assert_eq!(
            (s.samples[0].start, s.samples[0].end),
            (Some(1.5), Some(4.0))
        );
        assert_eq!((s.samples[1].start, s.samples[1].end), (None, None));
        // Sorted distinct labels: "playing guitar, loudly" < "swimming".
        assert_eq!(s.samples[0].label_index, 0);
        assert_eq!(s.samples[1].label_index, 1);
        assert_eq!(
            s.classes(),
            vec![
                ("playing guitar, loudly".to_owned(), 0),
                ("swimming".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn headerless_csv_and_integer_labels() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "m.csv", "x.mp4,7\ny.mp4,3\nz.mp4\n");
        let s = Samples::from_manifest(&p).unwrap();
        let idx: Vec<i64> = s.samples.iter().map(|s| s.label_index).collect();
        assert_eq!(idx, vec![7, 3, -1]);
        // Integer labels are their own indices; a row without a label adds no class.
        assert_eq!(s.classes(), vec![("3".to_owned(), 3), ("7".to_owned(), 7)]);
    }

    #[test]
    fn jsonl_rows_and_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "m.jsonl",
            "{\"path\": \"a.mp4\", \"label\": \"cat\", \"start\": 0.5}\n\n{\"video\": \"b.mp4\", \"label\": 2}\n",
        );
        let s = Samples::from_manifest(&p).unwrap();
        assert_eq!(s.samples[0].start, Some(0.5));
        assert_eq!(s.samples[1].label.as_deref(), Some("2"));
        let bad = write(
            dir.path(),
            "bad.jsonl",
            "{\"path\": \"a.mp4\"}\n{\"label\": 1}\n",
        );
        match Samples::from_manifest(&bad) {
            Err(ManifestError::Parse { line, .. }) => assert_eq!(line, 2),
            other => panic!("{other:?}"),
        }
        let bad = write(dir.path(), "bad.csv", "path,start,end\na.mp4,3,2\n");
        assert!(matches!(
            Samples::from_manifest(&bad),
            Err(ManifestError::Parse { line: 2, .. })
        ));
    }

    #[test]
    fn scan_is_sorted_and_relative() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("b")).unwrap();
        for f in ["b/z.mp4", "a.mkv", "b/a.webm", "notes.txt"] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let s = Samples::scan(dir.path());
        let v: Vec<&str> = s.samples.iter().map(|s| s.video.as_str()).collect();
        assert_eq!(v, vec!["a.mkv", "b/a.webm", "b/z.mp4"]);
    }
}
