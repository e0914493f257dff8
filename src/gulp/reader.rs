//! Reading a GulpIO directory: chunk meta files parsed once at start-up; data files opened for each run
//! of frames and read a record at a time (`pread`).
//!
//! Input: a directory of `data_<k>.gulp`/`meta_<k>.gmeta` pairs (and optionally `label2idx.json`).
//! Output: a [`GulpDataset`]: per video id its chunk, frame records and `meta_data[0]`; a frame's JPEG bytes
//! by (id, k); a [`VideoIndex`] per id (every frame a keyframe, pts = k, time base from a stored `fps`).
//!
//! Damage is confined to the videos it touches: a meta file that cannot be parsed makes its chunk's ids
//! unknown (a request for an id not found then answers that some chunk is unreadable, not that the id does
//! not exist); a record reaching past the end of its data file (a truncated `.gulp`), a missing data file
//! or an id present in two chunks (or twice in one) marks those videos corrupt; a record that is not valid JPEG fails the
//! frames that need it. Everything else keeps serving.
//!
//! Records are read with `pread` into the caller's buffer, not through a memory map: a data file truncated
//! in place while served (`cp` or `rsync --inplace` over a chunk) would make a mapped read fault (SIGBUS)
//! and take the daemon down with it; a read answers short instead, and only the frames past the new end
//! fail. Files are opened per run, not held: a dataset of thousands of chunks would otherwise hold
//! thousands of descriptors. A chunk whose path names another file than at start-up (renamed over) is
//! refused, since the start-up meta data no longer describes it. A record is at most [`MAX_RECORD`]
//! bytes, so no meta file can make a read allocate more.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::jpeg::Decoder;
use super::{chunk_number, data_name, meta_name, misnamed_chunk, ChunkFile, FrameInfo};
use crate::index::{FrameEntry, IndexMethod, SeekMode, VideoIndex};

/// Frame rate assumed for videos whose meta data stores none (GulpIO itself stores no frame rate).
pub const DEFAULT_FPS: f64 = 25.0;

/// [`GulpDataset::max_pixels`] unless set: `--max-side`'s default, squared.
pub const DEFAULT_MAX_PIXELS: u64 = 8192 * 8192;

/// The longest record read: 256 MiB, several times any JPEG of an 8192x8192 picture at quality 100. A
/// meta file naming a longer record makes its video unreadable rather than make each read allocate it.
pub const MAX_RECORD: u64 = 256 << 20;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum GulpError {
    #[error("video {id:?} not in gulp dataset {root:?}")]
    NotFound { root: String, id: String },
    #[error("video {id:?} is not readable: {reason}")]
    Corrupt { id: String, reason: String },
    #[error("cannot read gulp dataset {path:?}: {reason}")]
    Io { path: String, reason: String },
    #[error("video {id:?}: frames too large: {width}x{height} is more than the {max_pixels} pixels a frame may have (--max-side squared)")]
    TooLarge {
        id: String,
        width: u32,
        height: u32,
        max_pixels: u64,
    },
}

/// One chunk's data file.
struct Chunk {
    number: u64,
    data_path: PathBuf,
    /// The data file's (device, inode) at start-up; Err says why it is unusable (missing, unreadable,
    /// empty).
    file: Result<(u64, u64), String>,
    size: u64,
    mtime_ns: i128,
}

/// One video's data file, open for a run of reads.
pub struct Records<'a> {
    id: &'a str,
    entry: &'a Entry,
    chunk: &'a Chunk,
    file: std::fs::File,
}

/// One video: where its records are and its meta data.
#[derive(Debug)]
pub struct Entry {
    chunk: usize,
    pub frames: Vec<FrameInfo>,
    /// `meta_data[0]`, or null.
    pub meta: serde_json::Value,
    /// Why the whole video is unreadable (truncated data file, duplicate id, ...).
    problem: Option<String>,
}

pub struct GulpDataset {
    pub root: PathBuf,
    /// The most pixels a stored frame may have (`--max-side` squared): a record whose JPEG header claims
    /// more is refused before anything is allocated for it.
    pub max_pixels: u64,
    chunks: Vec<Chunk>,
    videos: BTreeMap<String, Entry>,
    /// Meta files that could not be read or parsed, with the reason.
    pub broken: Vec<String>,
    /// `label2idx.json` when present: its map, or why it is not a JSON object of label → integer.
    pub label2idx: Option<Result<BTreeMap<String, i64>, String>>,
}

impl std::fmt::Debug for GulpDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GulpDataset({}, {} chunks, {} videos)",
            self.root.display(),
            self.chunks.len(),
            self.videos.len()
        )
    }
}

/// A video of a served gulp dataset, as a decode job carries it.
#[derive(Clone, Debug)]
pub struct GulpVideo {
    pub dataset: Arc<GulpDataset>,
    pub id: Arc<str>,
}

/// The raw `.gmeta` entry.
#[derive(serde::Deserialize)]
struct RawEntry {
    frame_info: Vec<(u64, u64, u64)>,
    #[serde(default)]
    meta_data: Vec<serde_json::Value>,
}

/// A `.gmeta` object's entries in file order, an id listed twice kept twice (a map keeps the last).
struct RawEntries(Vec<(String, RawEntry)>);

impl<'de> serde::Deserialize<'de> for RawEntries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RawEntries, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawEntries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of id → {frame_info, meta_data}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<RawEntries, A::Error> {
                let mut entries = Vec::new();
                while let Some(e) = m.next_entry()? {
                    entries.push(e);
                }
                Ok(RawEntries(entries))
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// Parses one `.gmeta` file's text into (id, frames, meta_data[0]) in file order; an id the file lists
/// twice comes twice (the caller reports it).
pub fn parse_meta(text: &str) -> Result<Vec<(String, Vec<FrameInfo>, serde_json::Value)>, String> {
    let RawEntries(entries) = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(entries
        .into_iter()
        .map(|(id, raw)| {
            let frames = raw
                .frame_info
                .into_iter()
                .map(|(offset, pad, length)| FrameInfo {
                    offset,
                    pad,
                    length,
                })
                .collect();
            let meta = raw
                .meta_data
                .into_iter()
                .next()
                .unwrap_or(serde_json::Value::Null);
            (id, frames, meta)
        })
        .collect())
}

/// The chunk files of a directory.
#[derive(Debug, Default)]
pub struct ChunkList {
    /// Numbers of the `data_<k>.gulp` files, sorted.
    pub data: Vec<u64>,
    /// Numbers of the `meta_<k>.gmeta` files, sorted.
    pub meta: Vec<u64>,
    /// Names that look like chunk files but are not GulpIO's (`meta_007.gmeta`), sorted.
    pub misnamed: Vec<String>,
}

/// The chunk files present in `dir`.
pub fn list_chunks(dir: &Path) -> std::io::Result<ChunkList> {
    let mut list = ChunkList::default();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        match chunk_number(&name) {
            Some((ChunkFile::Data, k)) => list.data.push(k),
            Some((ChunkFile::Meta, k)) => list.meta.push(k),
            None if misnamed_chunk(&name) => list.misnamed.push(name),
            None => {}
        }
    }
    list.data.sort_unstable();
    list.meta.sort_unstable();
    list.misnamed.sort_unstable();
    Ok(list)
}

/// Why a misnamed chunk file is not read.
pub fn misnamed_reason(name: &str) -> String {
    format!("{name}: not a GulpIO chunk name (chunks are numbered without leading zeros, as meta_7.gmeta and data_7.gulp); it is not read")
}

fn open_data(path: &Path) -> (Result<(u64, u64), String>, u64, i128) {
    use std::os::unix::fs::MetadataExt;
    let meta = match crate::state::open_regular(std::fs::OpenOptions::new().read(true), path) {
        Ok((_, m)) => m,
        Err(e) => return (Err(format!("{}: {e}", path.display())), 0, 0),
    };
    let mtime_ns = crate::dataset::mtime_ns(&meta);
    if meta.len() == 0 {
        return (Err(format!("{} is empty", path.display())), 0, mtime_ns);
    }
    (Ok((meta.dev(), meta.ino())), meta.len(), mtime_ns)
}

impl GulpDataset {
    /// Reads every meta file of `root` and notes which file each data file is. Fails only when the directory itself
    /// cannot be listed; damaged chunks are recorded and affect their own videos.
    pub fn open(root: &Path) -> Result<GulpDataset, GulpError> {
        let io = |e: std::io::Error| GulpError::Io {
            path: root.display().to_string(),
            reason: e.to_string(),
        };
        let list = list_chunks(root).map_err(io)?;
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut videos: BTreeMap<String, Entry> = BTreeMap::new();
        let mut broken = Vec::new();
        for name in &list.misnamed {
            let reason = misnamed_reason(name);
            tracing::warn!(root = %root.display(), %reason, "misnamed gulp chunk file; its videos are not served");
            broken.push(reason);
        }
        for k in list.meta {
            let meta_path = root.join(meta_name(k));
            let parsed = crate::state::read_regular(&meta_path)
                .map_err(|e| e.to_string())
                .and_then(|b| String::from_utf8(b).map_err(|e| e.to_string()))
                .and_then(|text| parse_meta(&text));
            let entries = match parsed {
                Ok(e) => e,
                Err(reason) => {
                    tracing::warn!(path = %meta_path.display(), %reason, "unreadable gulp meta file; its videos are not served");
                    broken.push(format!("{}: {reason}", meta_name(k)));
                    continue;
                }
            };
            let data_path = root.join(data_name(k));
            let (file, size, mtime_ns) = open_data(&data_path);
            let chunk = chunks.len();
            for (id, frames, meta) in entries {
                let problem = match &file {
                    Err(e) => Some(format!("data file unusable: {e}")),
                    Ok(_) => frames.iter().enumerate().find_map(|(i, f)| {
                        match f.jpeg_range() {
                            None => Some(format!("frame {i} has an inconsistent record {:?}", (f.offset, f.pad, f.length))),
                            Some(_) if f.length > MAX_RECORD => Some(format!(
                                "frame {i}'s record is {} bytes, more than the {MAX_RECORD} any frame may take",
                                f.length
                            )),
                            Some(r) if r.end > size || f.offset + f.length > size => Some(format!(
                                "frame {i} lies at bytes {}..{} but {} holds {size} bytes (truncated)",
                                f.offset,
                                f.offset + f.length,
                                data_name(k)
                            )),
                            Some(_) => None,
                        }
                    }),
                }
                .or_else(|| frames.is_empty().then(|| "no frames".to_owned()));
                if let Some(prev) = videos.get_mut(&id) {
                    // Which entry is the video is unknown: neither is served. (This chunk is pushed
                    // after its entries, so an id it lists twice finds no chunk here.)
                    prev.problem = Some(match chunks.get(prev.chunk) {
                        Some(c) => format!("id is in chunks {} and {k}", c.number),
                        None => format!("id is listed twice in {}", meta_name(k)),
                    });
                    continue;
                }
                videos.insert(
                    id,
                    Entry {
                        chunk,
                        frames,
                        meta,
                        problem,
                    },
                );
            }
            chunks.push(Chunk {
                number: k,
                data_path,
                file,
                size,
                mtime_ns,
            });
        }
        let label2idx = crate::state::read_regular(&root.join("label2idx.json"))
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map(|t| parse_label2idx(&t));
        Ok(GulpDataset {
            root: root.to_path_buf(),
            max_pixels: DEFAULT_MAX_PIXELS,
            chunks,
            videos,
            broken,
            label2idx,
        })
    }

    /// Bounds stored frames to `max_pixels` pixels (the daemon's `--max-side` squared).
    pub fn with_max_pixels(mut self, max_pixels: u64) -> GulpDataset {
        self.max_pixels = max_pixels;
        self
    }

    /// Video ids, sorted.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.videos.keys().map(|s| s.as_str())
    }

    pub fn len(&self) -> usize {
        self.videos.len()
    }

    pub fn is_empty(&self) -> bool {
        self.videos.is_empty()
    }

    /// A video's entry, or why it cannot be served.
    pub fn entry(&self, id: &str) -> Result<&Entry, GulpError> {
        let Some(e) = self.videos.get(id) else {
            if !self.broken.is_empty() {
                return Err(GulpError::Corrupt {
                    id: id.to_owned(),
                    reason: format!(
                        "not found, and the dataset has unreadable chunks that may hold it ({})",
                        self.broken.join("; ")
                    ),
                });
            }
            return Err(GulpError::NotFound {
                root: self.root.display().to_string(),
                id: id.to_owned(),
            });
        };
        if let Some(p) = &e.problem {
            return Err(GulpError::Corrupt {
                id: id.to_owned(),
                reason: p.clone(),
            });
        }
        Ok(e)
    }

    /// Identity of the chunk data file holding `id`: (path, size, mtime in ns), for cache keys.
    pub fn identity(&self, id: &str) -> Result<(PathBuf, u64, i128), GulpError> {
        let e = self.entry(id)?;
        let c = &self.chunks[e.chunk];
        Ok((c.data_path.clone(), c.size, c.mtime_ns))
    }

    /// The data file holding `id`'s frames, opened: the file the meta data described at start-up.
    pub fn records<'a>(&'a self, id: &'a str) -> Result<Records<'a>, GulpError> {
        use std::os::unix::fs::MetadataExt;
        let entry = self.entry(id)?;
        let chunk = &self.chunks[entry.chunk];
        let corrupt = |reason: String| GulpError::Corrupt {
            id: id.to_owned(),
            reason,
        };
        let identity = chunk.file.as_ref().map_err(|m| corrupt(m.clone()))?;
        // Non-blocking and regular files only: a FIFO renamed over a chunk held the decode thread in
        // open(2). Gone or not a file is the data lost; anything else (EMFILE, EACCES) the daemon's.
        let (file, now) =
            crate::state::open_regular(std::fs::OpenOptions::new().read(true), &chunk.data_path)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidData => {
                        corrupt(format!("{}: {e}", chunk.data_path.display()))
                    }
                    _ => GulpError::Io {
                        path: chunk.data_path.display().to_string(),
                        reason: e.to_string(),
                    },
                })?;
        if (now.dev(), now.ino()) != *identity {
            return Err(corrupt(format!(
                "{} was replaced while served; its meta data was read at start-up (restart the daemon to serve the new chunk)",
                data_name(chunk.number)
            )));
        }
        Ok(Records {
            id,
            entry,
            chunk,
            file,
        })
    }

    /// The JPEG bytes of frame `k` of `id`, in a new buffer.
    pub fn jpeg(&self, id: &str, k: usize) -> Result<Vec<u8>, GulpError> {
        let mut buf = Vec::new();
        self.records(id)?.read(k, &mut buf)?;
        Ok(buf)
    }

    /// The frame table and stream facts of `id`: frame k has pts k in a time base of 1/fps (the stored
    /// `fps`, else [`DEFAULT_FPS`]); every frame is a keyframe; the size is the first readable frame's.
    pub fn index(&self, id: &str) -> Result<VideoIndex, GulpError> {
        let e = self.entry(id)?;
        let mut decoder = Decoder::new().map_err(|err| GulpError::Io {
            path: self.root.display().to_string(),
            reason: err.to_string(),
        })?;
        // The size is the first frame's whose JPEG header reads: one bad record fails the requests
        // that need it, as everywhere, not the whole video (a bad frame 0 made it unreadable).
        let records = self.records(id)?;
        let mut first_error = None;
        let mut bytes = Vec::new();
        let size = (0..e.frames.len()).find_map(|k| {
            let read = records.read(k, &mut bytes).and_then(|()| {
                decoder.header(&bytes).map_err(|err| GulpError::Corrupt {
                    id: id.to_owned(),
                    reason: format!("frame {k} is not a valid JPEG: {err}"),
                })
            });
            read.map_err(|err| first_error.get_or_insert(err)).ok()
        });
        let (width, height) = match size {
            Some(wh) => wh,
            None => {
                return Err(first_error.unwrap_or_else(|| GulpError::Corrupt {
                    id: id.to_owned(),
                    reason: "no frame is stored".into(),
                }))
            }
        };
        if width as u64 * height as u64 > self.max_pixels {
            return Err(GulpError::TooLarge {
                id: id.to_owned(),
                width,
                height,
                max_pixels: self.max_pixels,
            });
        }
        let fps = super::stored_fps(&e.meta).unwrap_or(DEFAULT_FPS);
        // pts k → k / fps seconds: exactly for integral rates, else to 10^-6 of a frame below 1000 fps
        // and 10^-5 above (fps lies in FPS_RANGE: fps * scale fits an i32 and is at least 1000), reduced.
        let time_base = if fps.fract() == 0.0 {
            (1, fps as i32)
        } else {
            let scale: i64 = if fps < 1000.0 { 1_000_000 } else { 100_000 };
            let den = (fps * scale as f64).round() as i64;
            let g = gcd(scale, den).max(1);
            ((scale / g) as i32, (den / g) as i32)
        };
        let n = e.frames.len();
        Ok(VideoIndex {
            stream: 0,
            codec: "mjpeg".into(),
            pixel_format: "rgb24".into(),
            width,
            height,
            rotation: 0,
            mirror: false,
            time_base,
            avg_fps: fps,
            frames: (0..n as i64)
                .map(|k| FrameEntry {
                    pts: k,
                    duration: 1,
                    key: true,
                    stated_duration: 1,
                })
                .collect(),
            keyframes: (0..n).collect(),
            declared_frames: 0,
            seek: SeekMode::ByPts,
            method: IndexMethod::Stored,
            h264_nal_length: None,
            damaged: false,
        })
    }

    /// The dataset's samples for streams: every id (sorted) with its meta data's label; label indices from
    /// `label2idx.json` when it numbers every label. Err when a label's index would be negative
    /// ([`Samples::negative_label`](crate::manifest::Samples::negative_label)).
    pub fn samples(&self) -> Result<crate::manifest::Samples, String> {
        let samples = crate::manifest::Samples::from_labeled(
            self.videos
                .iter()
                .map(|(id, e)| (id.clone(), super::stored_label(&e.meta)))
                .collect(),
        );
        let (samples, ignored) = number_labels(samples, self.label2idx.as_ref());
        if let Some(why) = ignored {
            tracing::warn!(root = %self.root.display(), problem = %why, "label2idx.json ignored: label indices follow the sorted labels");
        }
        match samples.negative_label() {
            Some(why) => Err(format!(
                "gulp dataset {}: {why} (or give a label2idx.json mapping every label to an index >= 0)",
                self.root.display()
            )),
            None => Ok(samples),
        }
    }
}

impl Records<'_> {
    /// The JPEG bytes of frame `k`, read into `buf` (replacing what it held).
    pub fn read(&self, k: usize, buf: &mut Vec<u8>) -> Result<(), GulpError> {
        use std::os::unix::fs::FileExt;
        let corrupt = |reason: String| GulpError::Corrupt {
            id: self.id.to_owned(),
            reason,
        };
        let f = self.entry.frames.get(k).ok_or_else(|| {
            corrupt(format!(
                "frame {k} of {} is not stored",
                self.entry.frames.len()
            ))
        })?;
        let r = f
            .jpeg_range()
            .ok_or_else(|| corrupt(format!("frame {k} has an inconsistent record")))?;
        // Checked at start-up against the size then; the file may have shrunk since (a short read).
        if r.end > self.chunk.size || r.end - r.start > MAX_RECORD {
            return Err(corrupt(format!(
                "frame {k} lies past the end of its data file"
            )));
        }
        buf.clear();
        buf.resize((r.end - r.start) as usize, 0);
        self.file.read_exact_at(buf, r.start).map_err(|err| {
            corrupt(if err.kind() == std::io::ErrorKind::UnexpectedEof {
                let now = self.file.metadata().map_or(0, |m| m.len());
                format!(
                    "frame {k} lies at bytes {}..{} but {} now holds {now} bytes: it was truncated while served (the daemon serves the chunks as they were at start-up: restart it after changing the dataset)",
                    r.start,
                    r.end,
                    data_name(self.chunk.number)
                )
            } else {
                format!(
                    "cannot read frame {k} from {}: {err}",
                    self.chunk.data_path.display()
                )
            })
        })
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `samples` with the label indices of `label2idx` (a parsed `label2idx.json`) when it numbers every
/// label, and why it was ignored otherwise (two labels could share an index when it is used in part,
/// one named and one numbered by its place: a training job would silently merge two classes).
pub(crate) fn number_labels(
    samples: crate::manifest::Samples,
    label2idx: Option<&Result<BTreeMap<String, i64>, String>>,
) -> (crate::manifest::Samples, Option<String>) {
    let why = match label2idx {
        None => return (samples, None),
        Some(Err(why)) => why.clone(),
        Some(Ok(map)) => {
            match label2idx_problem(map, samples.classes().iter().map(|(l, _)| l.as_str())) {
                None => return (samples.with_label_indices(|l| map.get(l).copied()), None),
                Some(why) => why,
            }
        }
    };
    (samples, Some(why))
}

/// `label2idx.json`'s map, or why it is not a JSON object of label → integer index >= 0 (-1 is the
/// label_index of a sample without a label).
pub(crate) fn parse_label2idx(text: &str) -> Result<BTreeMap<String, i64>, String> {
    let m = serde_json::from_str::<BTreeMap<String, serde_json::Value>>(text)
        .map_err(|e| format!("not a JSON object of label → integer ({e})"))?;
    m.into_iter()
        .map(|(k, v)| match v.as_i64() {
            Some(i) if i >= 0 => Ok((k, i)),
            Some(i) => Err(format!(
                "label {k:?} has index {i}: indices must be >= 0 (-1 means \"no label\")"
            )),
            None => Err(format!("label {k:?} has {v}, not an integer index")),
        })
        .collect()
}

/// Why `map` cannot number `labels` (every label of the dataset's meta data): a label it does not name,
/// or two labels it gives the same index.
pub(crate) fn label2idx_problem<'a>(
    map: &BTreeMap<String, i64>,
    labels: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let mut seen: BTreeMap<i64, &str> = BTreeMap::new();
    for l in labels {
        let Some(&i) = map.get(l) else {
            return Some(format!("it does not name label {l:?}"));
        };
        if let Some(other) = seen.insert(i, l) {
            return Some(format!(
                "it gives labels {other:?} and {l:?} the same index {i}"
            ));
        }
    }
    None
}
