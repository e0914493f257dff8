//! Pre-decoded datasets in TwentyBN's GulpIO format: reading ([`reader`]), writing ([`writer`]), checking
//! ([`check`]); `vserve ingest` (producing them from videos) is [`crate::commands::ingest`].
//!
//! The format, as GulpIO's reference implementation (`gulpio2`) writes it:
//! - a directory of chunk pairs `data_<k>.gulp` / `meta_<k>.gmeta`, paired by the integer `k`, plus an
//!   optional `label2idx.json` (`{label: index}`);
//! - `.gulp`: JPEG records back to back, no header; each record is zero-padded to a multiple of 4 bytes;
//! - `.gmeta`: a JSON object `{"<id>": {"frame_info": [[offset, pad, length], ...], "meta_data": [{...}]}}`;
//!   `length` includes the padding, so frame i's JPEG is `data[offset .. offset + length - pad]`; frames are
//!   in temporal order; ids are unique across chunks; readers use `meta_data[0]`.
//!
//! Frame k of a video is its k-th stored record. JPEG coding is libjpeg-turbo's ([`jpeg`]), decoded the way
//! gulpio2 decodes (fast integer IDCT, fast upsampling) so both readers give the same pixels.

pub mod check;
pub mod jpeg;
pub mod reader;
pub mod writer;

use std::path::Path;

/// Where one frame's record lies in a `.gulp` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// Byte offset of the record.
    pub offset: u64,
    /// Zero bytes after the JPEG data (0..=3).
    pub pad: u64,
    /// Record length, padding included.
    pub length: u64,
}

impl FrameInfo {
    /// The JPEG bytes' range in the data file, or None when the fields are inconsistent.
    pub fn jpeg_range(&self) -> Option<std::ops::Range<u64>> {
        let end = self.offset.checked_add(self.length)?;
        let jpeg_end = end.checked_sub(self.pad)?;
        (jpeg_end > self.offset).then_some(self.offset..jpeg_end)
    }
}

/// Padding that brings `n` bytes to a multiple of 4.
pub fn pad_for(n: usize) -> usize {
    (4 - n % 4) % 4
}

pub fn data_name(k: u64) -> String {
    format!("data_{k}.gulp")
}

pub fn meta_name(k: u64) -> String {
    format!("meta_{k}.gmeta")
}

/// `k` of `data_<k>.gulp` or `meta_<k>.gmeta`, `k` written as GulpIO writes it (no leading zeros); None
/// for any other name.
pub fn chunk_number(name: &str) -> Option<(ChunkFile, u64)> {
    let (kind, digits) = chunk_digits(name)?;
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    Some((kind, digits.parse().ok()?))
}

/// Whether `name` looks like a chunk file but is not one GulpIO names (`meta_007.gmeta`, or a number
/// too long for u64): chunks are paired by their number, so such a file was read as another chunk's.
pub fn misnamed_chunk(name: &str) -> bool {
    chunk_digits(name).is_some() && chunk_number(name).is_none()
}

fn chunk_digits(name: &str) -> Option<(ChunkFile, &str)> {
    let (kind, rest) = if let Some(r) = name.strip_prefix("data_") {
        (ChunkFile::Data, r.strip_suffix(".gulp")?)
    } else if let Some(r) = name.strip_prefix("meta_") {
        (ChunkFile::Meta, r.strip_suffix(".gmeta")?)
    } else {
        return None;
    };
    (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())).then_some((kind, rest))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkFile {
    Data,
    Meta,
}

/// True when `dir` holds at least one `meta_<k>.gmeta` or `data_<k>.gulp` file (not looking deeper).
pub fn is_gulp_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| chunk_digits(n).is_some())
        })
    })
}

/// The frame rates a gulp dataset may store (`fps` in its meta data) and `vserve ingest --fps` may ask
/// for: one frame a thousand seconds to ten thousand a second. Outside them a stored rate is ignored
/// (the video is served at [`reader::DEFAULT_FPS`]) and ingest refuses it.
pub const FPS_RANGE: std::ops::RangeInclusive<f64> = 0.001..=10_000.0;

/// Frame rate stored in a video's meta data (`fps`, as vserve's ingest writes it), when present and in
/// [`FPS_RANGE`].
pub fn stored_fps(meta: &serde_json::Value) -> Option<f64> {
    meta.get("fps")
        .and_then(|v| v.as_f64())
        .filter(|f| FPS_RANGE.contains(f))
}

/// A video's label in its meta data (`label`, a string or a number), as text.
pub fn stored_label(meta: &serde_json::Value) -> Option<String> {
    match meta.get("label")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_names_pair_by_number() {
        assert_eq!(chunk_number("data_0.gulp"), Some((ChunkFile::Data, 0)));
        assert_eq!(chunk_number("meta_12.gmeta"), Some((ChunkFile::Meta, 12)));
        for bad in [
            "data_.gulp",
            "data_1.gmeta",
            "meta_x.gmeta",
            "data_1.gulp.tmp",
            "label2idx.json",
            "meta_007.gmeta",
            "data_00.gulp",
            "data_99999999999999999999999.gulp",
        ] {
            assert_eq!(chunk_number(bad), None, "{bad}");
        }
        assert!(misnamed_chunk("meta_007.gmeta"));
        assert!(misnamed_chunk("data_00.gulp"));
        assert!(!misnamed_chunk("data_0.gulp"));
        assert!(!misnamed_chunk("data_x.gulp"));
        assert_eq!(stored_fps(&serde_json::json!({"fps": 29.97})), Some(29.97));
        assert_eq!(stored_fps(&serde_json::json!({"fps": 2000})), Some(2000.0));
        for bad in [0.0004, 0.0, -5.0, 10000.5, 20000.0] {
            assert_eq!(
                stored_fps(&serde_json::json!({ "fps": bad })),
                None,
                "{bad}"
            );
        }
        assert_eq!(pad_for(8), 0);
        assert_eq!(pad_for(9), 3);
        let f = FrameInfo {
            offset: 8,
            pad: 3,
            length: 12,
        };
        assert_eq!(f.jpeg_range(), Some(8..17));
    }
}
