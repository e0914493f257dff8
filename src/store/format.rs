//! The store's file format, version 5: one little-endian file per (video, stream), laid out so that a
//! reader can memory-map it and read any field or frame in O(1) without parsing the rest.
//!
//! ```text
//! offset  bytes  field
//!      0      8  magic "VSRVSTOR"
//!      8      4  format version (4; versions 1 and 2 had no content sample, and version 1 no mirror flag:
//!                a version 2 record is read with content 0, a version 1 record also without its table;
//!                their headers end at 272. Version 3 is laid out as 4, but its tables made by decoding
//!                counted frames with no pts from 0 instead of taking their best-effort timestamps: such
//!                a table is read without its table, as version 1's. Version 4 is laid out as 5, but its
//!                checks called an MP4 cut short not media (unreadable, not corrupt): such a verdict is
//!                read as unchecked, so the file is judged again)
//!     12      4  CRC-32 (IEEE) of bytes 16..len
//!     16      8  len: the whole file's size
//!     24      8  identity: file size           32 16 identity: mtime, ns since the epoch (i128)
//!     48      4  identity: stream (u32::MAX = FFmpeg's best video stream)
//!     52      1  health (0 unchecked, 1 ok, 2 damaged, 3 unreadable, 4 quarantined)
//!     53      1  flags: 1 table present, 2 decode table, 4 seek from start, 8 table met decoder errors,
//!                16 display matrix mirrors (flip left-right after the rotation)
//!     54      1  index method (0 packet scan, 1 decode scan, 2 stored)
//!     55      1  1 when an unreadable video is corrupt media (else: not media FFmpeg reads)
//!     56      8  written, ms since the epoch (eviction order is the file's mtime; this is for humans)
//!     64      8  frames the whole-video check decoded     72 8 first bad frame (u64::MAX: none)
//!     80      8  n: frames in the table                   88 8 m: keyframes in the table
//!     96      8  frames declared by a truncated container
//!    104      4  container stream index   108 4 width   112 4 height   116 4 rotation
//!    120      4  time base num (i32)     124 4 time base den (i32)    128 8 average fps (f64)
//!    136      4  H.264 NAL length size (0: none)          140 4 r: damaged ranges
//!    144     96  3 column descriptors (pts, duration, stated duration), 32 bytes each:
//!                encoding u8 (0 linear, 1 i32 offsets, 2 i64), 7 reserved, base i64, step i64, offset u64
//!    240      8  offset of key bits (n bits, frame k = bit k%8 of byte k/8)
//!    248      8  offset of keyframes (m x u32)
//!    256      8  offset of damaged ranges (r x [u64 start, u64 end))
//!    264      8  offset of strings (u32 length + UTF-8 each: path, codec, pixel format, reason)
//!    272      8  content sample of the file the record was made from (0: unknown)
//!    280      8  file node it was made from: device    288 8 inode    296 16 status-change time, ns (i128)
//!                (all 0: unknown, versions 1 to 3)
//!    312         sections, each starting on an 8-byte boundary
//! ```
//!
//! Column value k: linear `base + k*step`; i32 offsets `base + data[k]`; i64 `data[k]`. Constant frame
//! rate videos (the usual case) store no per-frame numbers but the key bits: a 10-minute 30 fps video's
//! table costs ~2.6 KB; irregular timestamps cost 4 bytes per frame per irregular column.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Health, Key, Record};
use crate::dataset::FileNode;
use crate::index::table::{Column, ColumnKind, Packed, TableBytes};
use crate::index::{FrameEntry, IndexMethod, SeekMode, VideoIndex};

pub const MAGIC: &[u8; 8] = b"VSRVSTOR";
pub const VERSION: u32 = 5;
const HEADER: usize = 312;
/// Where the header of a version 3 record ends (it had no file node).
const HEADER_V3: usize = 280;
/// Where the header of a version 1 or 2 record ends (it had no content sample).
const HEADER_V2: usize = 272;
/// More frames than any real video has (a day at 1000 fps): a bound on what a decoder allocates.
const MAX_FRAMES: u64 = 1 << 27;

/// Why bytes are not a record this reader trusts.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("not a vserve store file (bad magic)")]
    Magic,
    #[error("store format version {0}, this build reads 1 to {VERSION}")]
    Version(u32),
    #[error("checksum mismatch (corrupt or torn file)")]
    Checksum,
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

/// CRC-32 (IEEE 802.3, reflected, as zlib's `crc32`).
pub fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut c = !0u32;
    for &b in bytes {
        c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// A column of i64s as stored.
enum Encoded {
    Linear { base: i64, step: i64 },
    Offsets { base: i64, offsets: Vec<i32> },
    Wide(Vec<i64>),
}

impl Encoded {
    fn of(values: &[i64]) -> Encoded {
        let base = values.first().copied().unwrap_or(0);
        let step = values.get(1).map_or(0, |v| v.wrapping_sub(base));
        let linear = values.iter().enumerate().all(|(k, &v)| {
            Some(v)
                == (k as i64)
                    .checked_mul(step)
                    .and_then(|x| x.checked_add(base))
        });
        if linear {
            return Encoded::Linear { base, step };
        }
        let offsets: Option<Vec<i32>> = values
            .iter()
            .map(|&v| v.checked_sub(base).and_then(|d| i32::try_from(d).ok()))
            .collect();
        match offsets {
            Some(offsets) => Encoded::Offsets { base, offsets },
            None => Encoded::Wide(values.to_vec()),
        }
    }
}

fn pad8(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(8) {
        out.push(0);
    }
}

fn put(out: &mut [u8], at: usize, bytes: &[u8]) {
    out[at..at + bytes.len()].copy_from_slice(bytes);
}

fn health_code(h: &Health) -> u8 {
    match h {
        Health::Unchecked => 0,
        Health::Ok { .. } => 1,
        Health::Damaged { .. } => 2,
        Health::Unreadable { .. } => 3,
        Health::Quarantined { .. } => 4,
    }
}

/// Serialises a record (its `written_ms` as given).
pub fn encode(r: &Record) -> Vec<u8> {
    let mut out = vec![0u8; HEADER];
    let k = &r.key;
    put(&mut out, 0, MAGIC);
    put(&mut out, 8, &VERSION.to_le_bytes());
    put(&mut out, 24, &k.size.to_le_bytes());
    put(&mut out, 32, &k.mtime_ns.to_le_bytes());
    put(&mut out, 48, &k.stream.unwrap_or(u32::MAX).to_le_bytes());
    out[52] = health_code(&r.health);
    let t = r.table.as_deref();
    let mut flags = 0u8;
    if let Some(t) = t {
        flags |= 1;
        if t.seek == SeekMode::FromStart {
            flags |= 4;
        }
        if t.damaged {
            flags |= 8;
        }
        if t.mirror {
            flags |= 16;
        }
        out[54] = match t.method {
            IndexMethod::PacketScan => 0,
            IndexMethod::DecodeScan => 1,
            IndexMethod::Stored => 2,
        };
    }
    if r.decode_table {
        flags |= 2;
    }
    out[53] = flags;
    out[55] = u8::from(matches!(r.health, Health::Unreadable { corrupt: true, .. }));
    put(&mut out, 56, &r.written_ms.to_le_bytes());
    put(&mut out, 272, &r.content.to_le_bytes());
    put(&mut out, 280, &r.node.dev.to_le_bytes());
    put(&mut out, 288, &r.node.ino.to_le_bytes());
    put(&mut out, 296, &r.node.ctime_ns.to_le_bytes());
    let (checked, first_bad, ranges, reason): (u64, u64, &[(u64, u64)], &str) = match &r.health {
        Health::Unchecked => (0, u64::MAX, &[], ""),
        Health::Ok { frames } => (*frames, u64::MAX, &[], ""),
        Health::Damaged {
            frames,
            first_bad_frame,
            bad_ranges,
            reason,
        } => (*frames, *first_bad_frame, bad_ranges, reason),
        Health::Unreadable { reason, .. } | Health::Quarantined { reason } => {
            (0, u64::MAX, &[], reason)
        }
    };
    put(&mut out, 64, &checked.to_le_bytes());
    put(&mut out, 72, &first_bad.to_le_bytes());
    let frames: Vec<FrameEntry> = t.map_or_else(Vec::new, |t| t.frames.iter().collect());
    let keyframes: Vec<usize> = t.map_or_else(Vec::new, |t| t.keyframes.to_vec());
    put(&mut out, 80, &(frames.len() as u64).to_le_bytes());
    put(&mut out, 88, &(keyframes.len() as u64).to_le_bytes());
    if let Some(t) = t {
        put(&mut out, 96, &t.declared_frames.to_le_bytes());
        put(&mut out, 104, &(t.stream as u32).to_le_bytes());
        put(&mut out, 108, &t.width.to_le_bytes());
        put(&mut out, 112, &t.height.to_le_bytes());
        put(&mut out, 116, &t.rotation.to_le_bytes());
        put(&mut out, 120, &t.time_base.0.to_le_bytes());
        put(&mut out, 124, &t.time_base.1.to_le_bytes());
        put(&mut out, 128, &t.avg_fps.to_le_bytes());
        let nal = t.h264_nal_length.map_or(0, |n| n as u32);
        put(&mut out, 136, &nal.to_le_bytes());
    }
    put(&mut out, 140, &(ranges.len() as u32).to_le_bytes());

    let columns = [
        Encoded::of(&frames.iter().map(|f| f.pts).collect::<Vec<_>>()),
        Encoded::of(&frames.iter().map(|f| f.duration).collect::<Vec<_>>()),
        Encoded::of(&frames.iter().map(|f| f.stated_duration).collect::<Vec<_>>()),
    ];
    for (i, c) in columns.iter().enumerate() {
        let d = 144 + i * 32;
        let offset = out.len() as u64;
        let (enc, base, step) = match c {
            Encoded::Linear { base, step } => (0u8, *base, *step),
            Encoded::Offsets { base, offsets } => {
                offsets
                    .iter()
                    .for_each(|o| out.extend_from_slice(&o.to_le_bytes()));
                (1, *base, 0)
            }
            Encoded::Wide(v) => {
                v.iter()
                    .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
                (2, 0, 0)
            }
        };
        pad8(&mut out);
        out[d] = enc;
        put(&mut out, d + 8, &base.to_le_bytes());
        put(&mut out, d + 16, &step.to_le_bytes());
        put(&mut out, d + 24, &offset.to_le_bytes());
    }
    let at = out.len() as u64;
    put(&mut out, 240, &at.to_le_bytes());
    let mut bits = vec![0u8; frames.len().div_ceil(8)];
    for (i, f) in frames.iter().enumerate() {
        if f.key {
            bits[i / 8] |= 1 << (i % 8);
        }
    }
    out.extend_from_slice(&bits);
    pad8(&mut out);
    let at = out.len() as u64;
    put(&mut out, 248, &at.to_le_bytes());
    for &kf in &keyframes {
        out.extend_from_slice(&(kf as u32).to_le_bytes());
    }
    pad8(&mut out);
    let at = out.len() as u64;
    put(&mut out, 256, &at.to_le_bytes());
    for &(s, e) in ranges {
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&e.to_le_bytes());
    }
    let at = out.len() as u64;
    put(&mut out, 264, &at.to_le_bytes());
    let path = k.path.as_os_str().as_encoded_bytes();
    let (codec, pix) = t.map_or(("", ""), |t| (t.codec.as_str(), t.pixel_format.as_str()));
    for s in [path, codec.as_bytes(), pix.as_bytes(), reason.as_bytes()] {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
    }
    pad8(&mut out);
    let len = out.len() as u64;
    put(&mut out, 16, &len.to_le_bytes());
    let crc = crc32(&out[16..]);
    put(&mut out, 12, &crc.to_le_bytes());
    out
}

/// Bounds-checked little-endian reads.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn slice(&self, at: u64, len: u64) -> Result<&[u8], FormatError> {
        let end = at
            .checked_add(len)
            .ok_or(FormatError::Malformed("offset"))?;
        if end > self.0.len() as u64 {
            return Err(FormatError::Malformed("section past the end"));
        }
        Ok(&self.0[at as usize..end as usize])
    }
    fn array<const N: usize>(&self, at: u64) -> Result<[u8; N], FormatError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.slice(at, N as u64)?);
        Ok(a)
    }
    fn u32(&self, at: u64) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(at)?))
    }
    fn i32(&self, at: u64) -> Result<i32, FormatError> {
        Ok(i32::from_le_bytes(self.array(at)?))
    }
    fn u64(&self, at: u64) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(at)?))
    }
    fn i64(&self, at: u64) -> Result<i64, FormatError> {
        Ok(i64::from_le_bytes(self.array(at)?))
    }

    fn column(&self, d: u64) -> Result<Column, FormatError> {
        let kind = match self.slice(d, 1)?[0] {
            0 => ColumnKind::Linear,
            1 => ColumnKind::Offsets,
            2 => ColumnKind::Wide,
            _ => return Err(FormatError::Malformed("column encoding")),
        };
        Ok(Column {
            kind,
            base: self.i64(d + 8)?,
            step: self.i64(d + 16)?,
            offset: usize::try_from(self.u64(d + 24)?)
                .map_err(|_| FormatError::Malformed("offset"))?,
        })
    }
}

/// `index` with its frames and keyframes packed as a record stores them, read in place: what a
/// cached table costs is then about its record's size (a few hundred bytes for a constant frame rate).
pub fn pack(index: VideoIndex) -> VideoIndex {
    let index = Arc::new(index);
    let record = Record {
        key: super::Key {
            path: PathBuf::new(),
            size: 0,
            mtime_ns: 0,
            stream: None,
        },
        health: Health::Unchecked,
        decode_table: false,
        table: Some(index.clone()),
        written_ms: 0,
        content: 0,
        node: FileNode::default(),
    };
    let packed = decode_owned(TableBytes::Heap(encode(&record).into_boxed_slice()));
    drop(record);
    match packed {
        Ok(Record { table: Some(t), .. }) => Arc::unwrap_or_clone(t),
        // An empty table (no frames) has no record form: kept as it is.
        _ => Arc::unwrap_or_clone(index),
    }
}

/// Parses and verifies a record (magic, version, length, checksum, every offset and invariant), copying
/// its bytes. The caller compares its identity with the one it looked up.
pub fn decode(bytes: &[u8]) -> Result<Record, FormatError> {
    decode_owned(TableBytes::Heap(bytes.into()))
}

/// [`decode`] of bytes the record keeps: its table (if any) reads its columns in place from them, a
/// heap copy or a memory map of the record file. Everything is verified here, once.
pub fn decode_owned(owned: TableBytes) -> Result<Record, FormatError> {
    let bytes = owned.as_slice();
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err(FormatError::Magic);
    }
    let b = Bytes(bytes);
    let version = b.u32(8)?;
    if !(1..=VERSION).contains(&version) {
        return Err(FormatError::Version(version));
    }
    let header = match version {
        4.. => HEADER,
        3 => HEADER_V3,
        _ => HEADER_V2,
    };
    if bytes.len() < header || b.u64(16)? != bytes.len() as u64 {
        return Err(FormatError::Checksum);
    }
    if b.u32(12)? != crc32(&bytes[16..]) {
        return Err(FormatError::Checksum);
    }
    let stream = b.u32(48)?;
    let flags = bytes[53];
    let n = b.u64(80)?;
    let m = b.u64(88)?;
    let r = b.u32(140)? as u64;
    if n > MAX_FRAMES || m > n {
        return Err(FormatError::Malformed("frame counts"));
    }
    // Strings.
    let mut at = b.u64(264)?;
    let mut strings: Vec<String> = Vec::with_capacity(4);
    let mut path_bytes = Vec::new();
    for i in 0..4 {
        let len = b.u32(at)? as u64;
        let s = b.slice(at + 4, len)?;
        if i == 0 {
            path_bytes = s.to_vec();
        }
        strings.push(
            String::from_utf8(s.to_vec())
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        );
        at += 4 + len;
    }
    let path = {
        use std::os::unix::ffi::OsStringExt;
        PathBuf::from(std::ffi::OsString::from_vec(path_bytes))
    };
    let key = Key {
        path,
        size: b.u64(24)?,
        mtime_ns: i128::from_le_bytes(b.array(32)?),
        stream: (stream != u32::MAX).then_some(stream),
    };
    let checked = b.u64(64)?;
    let first_bad = b.u64(72)?;
    let ranges_at = b.u64(256)?;
    let ranges = (0..r)
        .map(|i| Ok((b.u64(ranges_at + i * 16)?, b.u64(ranges_at + i * 16 + 8)?)))
        .collect::<Result<Vec<_>, FormatError>>()?;
    let reason = strings[3].clone();
    let health = match bytes[52] {
        0 => Health::Unchecked,
        1 => Health::Ok { frames: checked },
        2 => {
            if first_bad > checked || ranges.iter().any(|&(s, e)| s >= e || e > checked) {
                return Err(FormatError::Malformed("damage past the frames"));
            }
            Health::Damaged {
                frames: checked,
                first_bad_frame: first_bad,
                bad_ranges: ranges,
                reason,
            }
        }
        // Before version 5, `vserve check` opened a video apart from the index and called an MP4 cut
        // short not media: that verdict is not trusted (the file is judged again when next asked for).
        3 if version < 5 && bytes[55] != 1 => Health::Unchecked,
        3 => Health::Unreadable {
            reason,
            corrupt: bytes[55] == 1,
        },
        4 => Health::Quarantined { reason },
        _ => return Err(FormatError::Malformed("health")),
    };
    let decode_table = flags & 2 != 0;
    let written_ms = b.u64(56)?;
    let content = if version >= 3 { b.u64(272)? } else { 0 };
    let node = if version >= 4 {
        FileNode {
            dev: b.u64(280)?,
            ino: b.u64(288)?,
            ctime_ns: i128::from_le_bytes(b.array(296)?),
        }
    } else {
        FileNode::default()
    };
    // Version 1 did not record a mirrored display matrix, and before version 4 a table made by decoding
    // gave frames with no pts made-up timestamps (AVI B-frame streams): such a table is left to be built
    // again (as for a changed file), its health kept.
    let stale = version < 2 || (version < 4 && bytes[54] == 1);
    let table = if flags & 1 != 0 && !stale {
        if n == 0 {
            return Err(FormatError::Malformed("empty table"));
        }
        let columns = [b.column(144)?, b.column(176)?, b.column(208)?];
        let (bits_at, kf_at) = (b.u64(240)?, b.u64(248)?);
        let nal = b.u32(136)?;
        let mut index = VideoIndex {
            stream: b.u32(104)? as usize,
            codec: strings[1].clone(),
            pixel_format: strings[2].clone(),
            width: b.u32(108)?,
            height: b.u32(112)?,
            rotation: b.u32(116)?,
            mirror: flags & 16 != 0,
            time_base: (b.i32(120)?, b.i32(124)?),
            avg_fps: f64::from_le_bytes(b.array(128)?),
            frames: Vec::new().into(),
            keyframes: Vec::new().into(),
            declared_frames: b.u64(96)?,
            seek: if flags & 4 != 0 {
                SeekMode::FromStart
            } else {
                SeekMode::ByPts
            },
            method: match bytes[54] {
                0 => IndexMethod::PacketScan,
                1 => IndexMethod::DecodeScan,
                2 => IndexMethod::Stored,
                _ => return Err(FormatError::Malformed("index method")),
            },
            h264_nal_length: (nal != 0).then_some(nal as usize),
            damaged: flags & 8 != 0,
        };
        let at = |x: u64| usize::try_from(x).map_err(|_| FormatError::Malformed("offset"));
        // n <= MAX_FRAMES and m <= n were checked above; every section and value is checked here, once.
        let packed = Packed::new(
            owned,
            columns,
            at(bits_at)?,
            at(kf_at)?,
            n as usize,
            m as usize,
        )
        .map_err(|e| FormatError::Malformed(e.0))?;
        let packed = Arc::new(packed);
        index.frames = packed.frames();
        index.keyframes = packed.keyframes();
        Some(Arc::new(index))
    } else {
        None
    };
    Ok(Record {
        key,
        health,
        decode_table,
        table,
        written_ms,
        content,
        node,
    })
}
