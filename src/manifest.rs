//! A dataset's sample list: a manifest's rows, or the video files under its root, held compactly.
//!
//! Input: a manifest file (CSV or JSON Lines) or a dataset root. Output: [`Samples`], the ordered list
//! a stream samples from, each with a video path relative to the root, an optional label and optional
//! start/end seconds that trim the video.
//!
//! Formats:
//! - CSV (`.csv`, read by the `csv` crate, streaming): a header naming the columns `path` (or `video`,
//!   `filename`, `file`, `video_path`), `label` (or `class`), `start`, `end` in any order (other columns
//!   ignored); without a header the columns are
//!   `path[,label[,start,end]]`. Fields may be double-quoted (`""` is a quote inside one; a quoted field
//!   may hold commas and line breaks, though a path may not: name such a file in JSON Lines); every field is trimmed
//!   of surrounding whitespace; blank lines are skipped. Errors name the line the row starts on.
//! - JSON Lines (`.jsonl`, `.ndjson`): one object per line with `path` (or `video`) and optional
//!   `label` (string or number), `start`, `end`. Blank lines are skipped.
//!
//! A UTF-8 byte-order mark at the start of a manifest is skipped (the csv crate skipped it already; in
//! JSON Lines it made line 1 unparsable).
//!
//! Layout (a million samples cost tens of MB, not a heap object per sample): every path in one string
//! arena with one u64 end offset per sample, each sample's label as a u32 index into the sorted distinct
//! labels, start/end as one pair of f64 per sample only when some sample is trimmed. About the path's
//! length plus 12 bytes per sample.
//!
//! Invariants: rows keep the file's order; a scan lists files sorted by path, so the list (and every
//! epoch's order derived from it) is the same on every host. Paths are not resolved here: the dataset
//! confines them when a stream reads them. Label indices: when every label is an integer, the integer;
//! otherwise the label's position in the sorted set of distinct labels; -1 without a label (mostly
//! integers with a few names is warned about: [`Samples::warning`]). Computing them costs
//! O(n + k log k) for n rows and k distinct labels.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

/// One sample, borrowed from its [`Samples`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    pub video: &'a str,
    pub label: Option<&'a str>,
    pub label_index: i64,
    pub start: Option<f64>,
    pub end: Option<f64>,
}

/// A sample's class when it has no label.
const NO_CLASS: u32 = u32::MAX;

/// An ordered sample list (see the module comment for its layout).
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// Every sample's path, one after another.
    paths: String,
    /// Where each sample's path ends in `paths` (sample i is `ends[i-1]..ends[i]`).
    ends: Vec<u64>,
    /// Each sample's class (an index into `classes`), [`NO_CLASS`] without a label.
    class_of: Vec<u32>,
    /// The distinct labels, sorted, each with its label index.
    classes: Vec<(Box<str>, i64)>,
    /// Each sample's [start, end] seconds, NaN where absent; empty when no sample is trimmed.
    trims: Vec<[f64; 2]>,
    /// [`Samples::fingerprint`], computed at its first use.
    fingerprint: std::sync::OnceLock<u64>,
}

/// Equal lists: the same samples in the same order. Trims compare by their bits, so that two lists whose
/// untrimmed samples hold NaN are equal (a derived `==` made every reload of such a manifest a change).
impl PartialEq for Samples {
    fn eq(&self, other: &Samples) -> bool {
        self.paths == other.paths
            && self.ends == other.ends
            && self.class_of == other.class_of
            && self.classes == other.classes
            && self.trims.len() == other.trims.len()
            && self.trim_bits().eq(other.trim_bits())
    }
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

/// The largest manifest read: about ten million rows of a typical dataset (its sample list takes about
/// as much memory as the file).
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// The longest path a manifest row may name (Linux's `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;

/// Collects samples one at a time into the compact layout; [`SamplesBuilder::finish`] ranks the labels.
#[derive(Default)]
pub struct SamplesBuilder {
    paths: String,
    ends: Vec<u64>,
    /// Each sample's label, as the order its label was first seen.
    class_of: Vec<u32>,
    /// Labels by first sight, and the reverse.
    seen: Vec<Box<str>>,
    ids: HashMap<Box<str>, u32>,
    trims: Vec<[f64; 2]>,
}

impl SamplesBuilder {
    pub fn new() -> SamplesBuilder {
        SamplesBuilder::default()
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Appends a sample.
    pub fn push(&mut self, video: &str, label: Option<&str>, start: Option<f64>, end: Option<f64>) {
        self.paths.push_str(video);
        self.ends.push(self.paths.len() as u64);
        let class = match label {
            None => NO_CLASS,
            Some(l) => match self.ids.get(l) {
                Some(&id) => id,
                None => {
                    let id = self.seen.len() as u32;
                    self.seen.push(l.into());
                    self.ids.insert(l.into(), id);
                    id
                }
            },
        };
        self.class_of.push(class);
        if start.is_some() || end.is_some() || !self.trims.is_empty() {
            if self.trims.is_empty() {
                self.trims.resize(self.ends.len() - 1, [f64::NAN; 2]);
            }
            self.trims
                .push([start.unwrap_or(f64::NAN), end.unwrap_or(f64::NAN)]);
        }
    }

    /// The samples in the order pushed, label indices by the manifest rule.
    pub fn finish(self) -> Samples {
        let SamplesBuilder {
            mut paths,
            mut ends,
            mut class_of,
            seen,
            ids,
            mut trims,
        } = self;
        drop(ids);
        // Rank the distinct labels: O(k log k), then one pass over the samples.
        let mut order: Vec<u32> = (0..seen.len() as u32).collect();
        order.sort_unstable_by(|a, b| seen[*a as usize].cmp(&seen[*b as usize]));
        let mut rank = vec![0u32; seen.len()];
        for (r, &id) in order.iter().enumerate() {
            rank[id as usize] = r as u32;
        }
        for c in class_of.iter_mut().filter(|c| **c != NO_CLASS) {
            *c = rank[*c as usize];
        }
        let all_integers = seen.iter().all(|l| l.parse::<i64>().is_ok());
        let mut seen: Vec<Option<Box<str>>> = seen.into_iter().map(Some).collect();
        let classes = order
            .iter()
            .enumerate()
            .map(|(r, &id)| {
                let label = seen[id as usize].take().unwrap_or_default();
                let index = if all_integers {
                    label.parse().unwrap_or(-1)
                } else {
                    r as i64
                };
                (label, index)
            })
            .collect();
        paths.shrink_to_fit();
        ends.shrink_to_fit();
        class_of.shrink_to_fit();
        trims.shrink_to_fit();
        Samples {
            paths,
            ends,
            class_of,
            classes,
            trims,
            fingerprint: Default::default(),
        }
    }

    /// The samples sorted by path (as a scan lists them).
    pub fn finish_sorted(self) -> Samples {
        let s = self.finish();
        let mut order: Vec<usize> = (0..s.len()).collect();
        order.sort_unstable_by(|a, b| s.video(*a).cmp(s.video(*b)));
        let mut sorted = Samples {
            paths: String::with_capacity(s.paths.len()),
            ends: Vec::with_capacity(s.len()),
            class_of: Vec::with_capacity(s.len()),
            classes: s.classes.clone(),
            trims: Vec::with_capacity(s.trims.len()),
            fingerprint: Default::default(),
        };
        for &i in &order {
            sorted.paths.push_str(s.video(i));
            sorted.ends.push(sorted.paths.len() as u64);
            sorted.class_of.push(s.class_of[i]);
            if let Some(t) = s.trims.get(i) {
                sorted.trims.push(*t);
            }
        }
        sorted
    }
}

impl Samples {
    /// A hash of the list (paths, order, labels and their indices, trims): equal lists have equal
    /// fingerprints, and a changed list almost surely another. Opaque, and stable only within one build
    /// of the daemon; never 0 (0 means "none" to clients).
    pub fn fingerprint(&self) -> u64 {
        *self.fingerprint.get_or_init(|| {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            self.paths.hash(&mut h);
            self.ends.hash(&mut h);
            self.class_of.hash(&mut h);
            self.classes.hash(&mut h);
            self.trim_bits().for_each(|t| t.hash(&mut h));
            h.finish().max(1)
        })
    }

    /// Each trim's [start, end] as bits, so that NaN (no trim) compares and hashes as itself.
    fn trim_bits(&self) -> impl Iterator<Item = [u64; 2]> + '_ {
        self.trims.iter().map(|t| [t[0].to_bits(), t[1].to_bits()])
    }

    /// Reads a manifest; the format follows the extension (`.jsonl`/`.ndjson`, else CSV). Only a
    /// regular file of at most [`MAX_MANIFEST_BYTES`] is read: opening a FIFO waited for a writer for
    /// ever (every later reload waited behind it), and a symlink to /dev/zero grew the daemon until its
    /// allocator aborted it.
    pub fn from_manifest(path: &Path) -> Result<Samples, ManifestError> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let shown = path.display().to_string();
        let io = |reason: String| ManifestError::Io {
            path: shown.clone(),
            reason,
        };
        // Non-blocking: a FIFO opens at once (and is refused below) instead of waiting for a writer.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| io(e.to_string()))?;
        let meta = file.metadata().map_err(|e| io(e.to_string()))?;
        if !meta.is_file() {
            return Err(io(
                "not a regular file (a FIFO, a device or a directory): a manifest is read whole, from a file"
                    .into(),
            ));
        }
        let too_big = || {
            io(format!(
                "it is over the {} MiB a manifest may have",
                MAX_MANIFEST_BYTES >> 20
            ))
        };
        if meta.len() > MAX_MANIFEST_BYTES {
            return Err(too_big());
        }
        // A file growing while read stops at the bound too.
        let mut reader =
            std::io::BufReader::with_capacity(1 << 16, file.take(MAX_MANIFEST_BYTES + 1));
        skip_bom(&mut reader).map_err(|e| ManifestError::Io {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let mut b = SamplesBuilder::new();
        if ext == "jsonl" || ext == "ndjson" {
            parse_jsonl(&mut reader, &shown, &mut b)?;
        } else {
            parse_csv(&mut reader, &shown, &mut b)?;
        }
        if reader.into_inner().limit() == 0 {
            return Err(too_big());
        }
        Ok(b.finish())
    }

    /// A warning about a manifest that reads but is probably not what its author meant, None when there
    /// is nothing to say:
    /// - it lists no samples;
    /// - its labels are mostly integers but not all: the rule then numbers every label by its rank among
    ///   the names, so one stray label (a header line not recognised as one, a typo) renumbers every
    ///   sample;
    /// - its labels are all integers, and two spellings of one integer ("3", "03") share an index.
    pub fn warning(&self) -> Option<String> {
        if self.is_empty() {
            return Some(
                "the manifest lists no samples: its streams end at once, with no batch".into(),
            );
        }
        if let Some(why) = self.negative_label() {
            return Some(why);
        }
        let names: Vec<&str> = self
            .classes
            .iter()
            .filter(|(l, _)| l.parse::<i64>().is_err())
            .map(|(l, _)| &**l)
            .collect();
        let integers = self.classes.len() - names.len();
        if names.is_empty() {
            // Every label is an integer, numbered as itself: two spellings of one ("3", "03", "+3") are
            // two classes sharing one label index.
            let mut seen: HashMap<i64, &str> = HashMap::new();
            let mut clashes = Vec::new();
            for (l, _) in &self.classes {
                let v = l.parse::<i64>().expect("an integer label");
                if let Some(first) = seen.insert(v, l) {
                    clashes.push(format!("{first:?} and {l:?}"));
                }
            }
            if clashes.is_empty() {
                return None;
            }
            let more = if clashes.len() > 3 { ", ..." } else { "" };
            clashes.truncate(3);
            return Some(format!(
                "labels {}{more} are different strings of one integer: they share its label index but are listed as separate classes; write each label one way",
                clashes.join(", ")
            ));
        }
        if integers < names.len() {
            return None;
        }
        let shown: Vec<String> = names.iter().take(3).map(|l| format!("{l:?}")).collect();
        Some(format!(
            "{integers} of {} distinct labels are integers, but {} {} not ({}{}): every label is numbered by its rank among the sorted names instead of its integer; fix or remove those rows (a header names its columns path/video/filename and label/class)",
            self.classes.len(),
            names.len(),
            if names.len() == 1 { "is" } else { "are" },
            shown.join(", "),
            if names.len() > 3 { ", ..." } else { "" }
        ))
    }

    /// Lists the video files under `root` (by extension, symlinks not followed), sorted. Err when a
    /// directory could not be read (the list would be short); video names that are not UTF-8 are left
    /// out with a warning.
    pub fn scan(root: &Path) -> Result<Samples, String> {
        let mut b = SamplesBuilder::new();
        let trouble = crate::dataset::visit_videos(root, &mut |rel| b.push(rel, None, None, None));
        if !trouble.complete() {
            return Err(format!(
                "cannot list {}: {}",
                root.display(),
                trouble.describe()
            ));
        }
        if trouble.any() {
            tracing::warn!(root = %root.display(), "{}", trouble.describe());
        }
        Ok(b.finish_sorted())
    }

    /// Samples from (video, label) pairs in the given order, label indices by the manifest rule.
    pub fn from_labeled(rows: Vec<(String, Option<String>)>) -> Samples {
        let mut b = SamplesBuilder::new();
        for (video, label) in &rows {
            b.push(video, label.as_deref(), None, None);
        }
        b.finish()
    }

    /// The same samples with the label index of each label `index_of` names replaced (a GulpIO
    /// dataset's `label2idx.json`).
    pub fn with_label_indices(mut self, index_of: impl Fn(&str) -> Option<i64>) -> Samples {
        self.fingerprint = Default::default();
        for (label, index) in &mut self.classes {
            if let Some(i) = index_of(label) {
                *index = i;
            }
        }
        self
    }

    /// Why some label's index is negative, None when none is. Labels that are all integers are their
    /// own indices, so a label -1 would read as "no label" (the index of a sample without one) and -2 as a
    /// class no training loss accepts.
    pub fn negative_label(&self) -> Option<String> {
        let (l, i) = self.classes.iter().find(|(_, i)| *i < 0)?;
        Some(format!(
            "label {l:?} has label_index {i}: indices must be >= 0 (-1 means \"no label\"; labels that are all integers are their own indices), so number the classes from 0"
        ))
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Sample `i`'s video path. Panics when `i >= len()`, as indexing does.
    pub fn video(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.paths[start..self.ends[i] as usize]
    }

    /// Sample `i`. Panics when `i >= len()`, as indexing does.
    pub fn get(&self, i: usize) -> Sample<'_> {
        let (label, label_index) = match self.class_of[i] {
            NO_CLASS => (None, -1),
            c => {
                let (l, idx) = &self.classes[c as usize];
                (Some(&**l), *idx)
            }
        };
        let seconds = |v: f64| (!v.is_nan()).then_some(v);
        let [start, end] = self.trims.get(i).copied().unwrap_or([f64::NAN; 2]);
        Sample {
            video: self.video(i),
            label,
            label_index,
            start: seconds(start),
            end: seconds(end),
        }
    }

    /// Every sample in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Sample<'_>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// Each distinct label with its label index, sorted by label.
    pub fn classes(&self) -> Vec<(String, i64)> {
        self.classes
            .iter()
            .map(|(l, i)| (l.to_string(), *i))
            .collect()
    }

    /// Bytes held (the arena, offsets, classes and trims), for logs and the scale benchmark.
    pub fn approx_bytes(&self) -> usize {
        self.paths.capacity()
            + self.ends.capacity() * 8
            + self.class_of.capacity() * 4
            + self.trims.capacity() * 16
            + self
                .classes
                .iter()
                .map(|(l, _)| l.len() + 24)
                .sum::<usize>()
    }
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

fn check_row(video: &str, start: Option<f64>, end: Option<f64>) -> Result<(), String> {
    if video.is_empty() {
        return Err("empty path".into());
    }
    if video.contains('\0') {
        return Err(format!(
            "path {} holds a NUL byte, which no file name can (not a text manifest?)",
            crate::refusal::quoted(video, 60)
        ));
    }
    if video.len() > MAX_PATH_BYTES {
        return Err(format!(
            "path {} is {} bytes long, longer than any path ({MAX_PATH_BYTES} bytes)",
            crate::refusal::quoted(video, 60),
            video.len()
        ));
    }
    if let (Some(s), Some(e)) = (start, end) {
        if e <= s {
            return Err(format!("end {e} is not after start {s}"));
        }
    }
    Ok(())
}

/// Skips a UTF-8 byte-order mark at the start of a manifest (editors on Windows write one): left in, it
/// became part of the first CSV field (a header `path` not recognised, so read as a sample) or made the
/// first JSON line unparsable.
fn skip_bom(reader: &mut impl BufRead) -> std::io::Result<()> {
    const BOM: &[u8] = b"\xEF\xBB\xBF";
    if reader.fill_buf()?.starts_with(BOM) {
        reader.consume(BOM.len());
    }
    Ok(())
}

/// Header names of the path column (the first found is used), lower case.
const PATH_COLUMNS: &[&str] = &["path", "video", "filename", "file", "video_path"];
/// ... and of the label column.
const LABEL_COLUMNS: &[&str] = &["label", "class"];

fn parse_csv(
    reader: impl std::io::Read,
    path: &str,
    b: &mut SamplesBuilder,
) -> Result<(), ManifestError> {
    let err = |line: u64, reason: String| ManifestError::Parse {
        path: path.to_owned(),
        line: line as usize,
        reason,
    };
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        // Fields are trimmed here, after the path's check for line breaks: the reader's own trim took
        // the line break off a quote left open on the last line, whose rest then read as a path.
        .trim(csv::Trim::None)
        .from_reader(reader);
    let mut record = csv::StringRecord::new();
    // Column positions of path, label, start, end.
    let mut columns: Option<[Option<usize>; 4]> = None;
    loop {
        let line = csv.position().line();
        match csv.read_record(&mut record) {
            Ok(false) => return Ok(()),
            Ok(true) => {}
            Err(e) => {
                let at = e.position().map_or(line, |p| p.line());
                return Err(match e.kind() {
                    csv::ErrorKind::Io(io) => ManifestError::Io {
                        path: path.to_owned(),
                        reason: io.to_string(),
                    },
                    _ => err(at, e.to_string()),
                });
            }
        }
        let line = record.position().map_or(line, |p| p.line());
        if record.iter().all(|f| f.trim().is_empty()) {
            continue;
        }
        let [p, l, s, e] = match columns {
            Some(c) => c,
            None => {
                let names: Vec<String> = record
                    .iter()
                    .map(|f| f.trim().to_ascii_lowercase())
                    .collect();
                let find = |alts: &[&str]| names.iter().position(|n| alts.contains(&n.as_str()));
                if let Some(p) = find(PATH_COLUMNS) {
                    columns = Some([
                        Some(p),
                        find(LABEL_COLUMNS),
                        find(&["start", "time_start"]),
                        find(&["end", "time_end"]),
                    ]);
                    continue;
                }
                let c = [Some(0), Some(1), Some(2), Some(3)];
                columns = Some(c);
                c
            }
        };
        let raw = |c: Option<usize>| c.and_then(|c| record.get(c)).unwrap_or("");
        let get = |c: Option<usize>| raw(c).trim();
        // A file name may hold one, but in CSV it is far likelier a quote left open that swallowed the
        // rows after it (JSON Lines says a line break as \n: a path there may hold one).
        if raw(p).contains(['\n', '\r']) {
            return Err(err(
                line,
                format!(
                    "path {} holds a line break: a quote left open? (a path that holds one can be named in a JSON Lines manifest)",
                    crate::refusal::quoted(raw(p), 200)
                ),
            ));
        }
        let video = get(p);
        let label = Some(get(l)).filter(|l| !l.is_empty());
        let start = seconds(get(s), "start").map_err(|r| err(line, r))?;
        let end = seconds(get(e), "end").map_err(|r| err(line, r))?;
        check_row(video, start, end).map_err(|r| err(line, r))?;
        b.push(video, label, start, end);
    }
}

fn parse_jsonl(
    reader: impl BufRead,
    path: &str,
    b: &mut SamplesBuilder,
) -> Result<(), ManifestError> {
    let err = |line: usize, reason: String| ManifestError::Parse {
        path: path.to_owned(),
        line,
        reason,
    };
    for (i, line) in reader.lines().enumerate() {
        let line_no = i + 1;
        let line = line.map_err(|e| err(line_no, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| err(line_no, e.to_string()))?;
        let obj = v
            .as_object()
            .ok_or_else(|| err(line_no, "not a JSON object".into()))?;
        let video = obj
            .get("path")
            .or_else(|| obj.get("video"))
            .and_then(|v| v.as_str())
            .ok_or_else(|| err(line_no, "no \"path\" string".into()))?;
        let number;
        let label = match obj.get("label") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.as_str()),
            Some(serde_json::Value::Number(n)) => {
                number = n.to_string();
                Some(number.as_str())
            }
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
        let (start, end) = (num("start")?, num("end")?);
        check_row(video, start, end).map_err(|r| err(line_no, r))?;
        b.push(video, label, start, end);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
