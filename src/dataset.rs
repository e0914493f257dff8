//! Datasets: a name and a root directory. Clients name a video by its path relative to the root.
//!
//! Invariant: nothing outside the root is ever opened. A path is refused before touching the file
//! system when it is absolute, empty, or has a `..`/root/prefix component; after canonicalisation (which
//! resolves symlinks) it is refused again unless it still lies under the canonical root.
//!
//! Open what was checked: [`Dataset::open`] then opens the canonical path once, relative to a descriptor
//! of the root the dataset holds open, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` (an `O_NOFOLLOW` walk, one component at a time, where the kernel has no
//! `openat2`), `O_NONBLOCK` so a FIFO cannot block the open, and `fstat`s the descriptor: only a regular
//! file is accepted. A directory swapped for a symlink between the check and the open fails the open
//! (PERMISSION_DENIED) instead of serving what the symlink points at; everything downstream reads the
//! [`CheckedFile`]'s descriptor, never the path again.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod beneath;
mod walk;

use beneath::{node_of, open_root, openat2_beneath, walk_beneath, OPENAT2_MISSING};
#[cfg(test)]
pub(crate) use walk::make_too_long_dir;
pub use walk::{visit_videos, walk_videos, WalkTrouble, MAX_UNREADABLE_LISTED};

/// Extensions counted as videos when a dataset root is scanned.
pub const VIDEO_EXTENSIONS: &[&str] = &[
    "mp4", "m4v", "mov", "mkv", "webm", "avi", "mpeg", "mpg", "ts", "flv", "3gp", "ogv", "wmv",
];

#[derive(Clone, Debug)]
pub struct Dataset {
    pub name: String,
    /// Canonical root directory.
    pub root: PathBuf,
    /// The root as configured, made absolute: where it leads through symlinks is resolved once, at
    /// start ([`Dataset::root_moved`] tells when it leads elsewhere since).
    given: PathBuf,
    /// The root, held open (`O_PATH`): every video is opened beneath this descriptor, so a symlink put
    /// on the way cannot redirect opens elsewhere. Shared by clones; replaced when the root's path names
    /// another directory ([`Dataset::root_dir`]).
    dir: Arc<parking_lot::RwLock<Arc<HeldRoot>>>,
}

/// The root's descriptor and the (device, inode) it names.
#[derive(Debug)]
struct HeldRoot {
    fd: OwnedFd,
    node: Option<(u64, u64)>,
}

impl HeldRoot {
    fn new(fd: OwnedFd) -> Arc<HeldRoot> {
        let node = node_of(fd.as_raw_fd());
        Arc::new(HeldRoot { fd, node })
    }
}

/// A video file opened by [`Dataset::open`]: the descriptor of the regular file that was checked, and
/// what `fstat` said of it. Decoders read this descriptor (FFmpeg through `/proc/self/fd/N`), never the
/// path, so what is decoded is what was checked.
#[derive(Debug)]
pub struct CheckedFile {
    /// Canonical path (for messages and as the identity's name; never reopened by name).
    pub path: PathBuf,
    pub file: File,
    pub size: u64,
    /// Modification time in nanoseconds since the epoch (0 when unknown).
    pub mtime_ns: i128,
    /// Which file this is on its filesystem, and its last change: see [`FileNode`].
    pub node: FileNode,
}

/// The file node a descriptor reads: device, inode and status-change time. Size and mtime can be the
/// same for another file (renamed over the path, or rewritten in place with its mtime set back); the
/// inode or the change time then differs, which no one but the kernel sets. Part of a video's identity
/// within one run of the daemon, not across restarts (a copied dataset gets new inodes, and its stored
/// frame tables stay valid).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileNode {
    pub dev: u64,
    pub ino: u64,
    pub ctime_ns: i128,
}

impl FileNode {
    fn of(meta: &std::fs::Metadata) -> FileNode {
        use std::os::unix::fs::MetadataExt;
        FileNode {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
        }
    }
}

/// Bytes read from each end of a file for its [`CheckedFile::content_sample`].
pub const SAMPLE_BYTES: u64 = 16 << 10;

impl CheckedFile {
    /// A 64-bit digest of the file's size and of its first and last [`SAMPLE_BYTES`] (the whole file when
    /// it is shorter): where containers keep their headers and indexes, and the first coded pictures.
    /// Two different videos of the same size and mtime differ there, so a stored frame table is checked
    /// against it before it serves another file that took the old one's path (renamed over it, or
    /// rewritten in place with the mtime set back, across restarts too). Not a hash of the whole file: an
    /// edit of the middle alone goes unseen. Two reads of at most 16 KiB: a recall of a stored table cost no
    /// more with it (docs/BENCHMARKS.md, run s35; 64 KiB cost ~0.06 ms a recall).
    /// 0 when the file cannot be read (nothing is then concluded from it).
    pub fn content_sample(&self) -> u64 {
        use std::os::unix::fs::FileExt;
        let head_len = self.size.min(SAMPLE_BYTES);
        let tail_len = (self.size - head_len).min(SAMPLE_BYTES);
        let mut buf = vec![0u8; (head_len + tail_len) as usize];
        let (head, tail) = buf.split_at_mut(head_len as usize);
        if self.file.read_exact_at(head, 0).is_err()
            || self.file.read_exact_at(tail, self.size - tail_len).is_err()
        {
            return 0;
        }
        match digest(self.size, &buf) {
            0 => 1,
            h => h,
        }
    }

    /// The descriptor as a path FFmpeg can open: the same open file, whatever its path now names.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Wraps a file opened by a trusted path (tools and tests, not client requests): `O_NONBLOCK`, and
    /// the same regular-file check as [`Dataset::open`].
    pub fn open_trusted(path: &Path) -> std::io::Result<CheckedFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)?;
        CheckedFile::from_file(path, file).map_err(|kind| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is {kind}, not a regular file", path.display()),
            )
        })
    }

    /// Checks an open descriptor with `fstat`: Err(what it is) unless a regular file.
    fn from_file(path: &Path, file: File) -> Result<CheckedFile, String> {
        let meta = file.metadata().map_err(|e| format!("unreadable ({e})"))?;
        if !meta.is_file() {
            return Err(kind_of(&meta).to_owned());
        }
        Ok(CheckedFile {
            path: path.to_path_buf(),
            file,
            size: meta.len(),
            mtime_ns: mtime_ns(&meta),
            node: FileNode::of(&meta),
        })
    }
}

/// A fast 64-bit digest of `bytes` seeded with `seed` (a word at a time: multiply, rotate), for telling
/// files apart, not against an adversary.
fn digest(seed: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = seed ^ 0x243f_6a88_85a3_08d3;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(K).rotate_left(29);
    }
    h ^= bytes.len() as u64;
    h ^= h >> 31;
    h.wrapping_mul(K) ^ (h >> 29)
}

/// A file's modification time in nanoseconds since the epoch (0 when unknown): the mtime of every file
/// identity (checked files, store keys, quarantine entries).
pub fn mtime_ns(meta: &std::fs::Metadata) -> i128 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128)
}

pub use crate::state::kind_of;

/// `root` as it starts a quoted path in a message (`"/data/k400/`): what messages to clients drop, so
/// that they name a video relative to its dataset ([`Dataset::relative_message`], the catalogue's).
pub fn quoted_root(root: &Path) -> String {
    let quoted = format!("{:?}", format!("{}/", root.display()));
    quoted[..quoted.len() - 1].to_owned()
}

/// The most characters of a client's video path a message shows: the reason after it stays in the
/// status (a 5,000-character path filled the message, and its reason was cut off: probe D).
const SHOWN_CHARS: usize = 200;

/// `video` quoted as messages show a client's path, cut to [`SHOWN_CHARS`].
fn shown(video: &str) -> String {
    match video.char_indices().nth(SHOWN_CHARS) {
        None => format!("{video:?}"),
        Some((i, _)) => format!("{:?}... ({} bytes)", &video[..i], video.len()),
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DatasetError {
    #[error("video path {} {why}", shown(.video))]
    BadPath { video: String, why: &'static str },
    #[error("video path {} leaves dataset {dataset:?} (a path is relative to its root, has no '..', and does not resolve outside it)", shown(.video))]
    Outside { dataset: String, video: String },
    /// Quoted without quotation marks: messages to clients drop a dataset's root from quoted paths,
    /// which would turn an absolute path under the root into a relative one the daemon would serve.
    #[error(
        "video path {} is absolute: a path in dataset {dataset:?} is relative to its root",
        crate::refusal::quoted(.video, SHOWN_CHARS)
    )]
    Absolute { dataset: String, video: String },
    #[error("video {} not in dataset {dataset:?}", shown(.video))]
    NotFound { dataset: String, video: String },
    #[error("video {} in dataset {dataset:?} is {kind}, not a regular file", shown(.video))]
    NotAFile {
        dataset: String,
        video: String,
        kind: String,
    },
    /// The file, or a directory on its way, is not readable by the daemon's user (EACCES, EPERM): an
    /// operator's file modes, not a fault of the daemon's.
    #[error("cannot read {} in dataset {dataset:?}: {reason} (the daemon's user may not read it, or a directory on its way)", shown(.video))]
    Unreadable {
        dataset: String,
        video: String,
        reason: String,
    },
    #[error("cannot read {} in dataset {dataset:?}: {reason}", shown(.video))]
    Io {
        dataset: String,
        video: String,
        reason: String,
    },
}

impl Dataset {
    /// A failed read of `video`: refused by file modes, or another I/O error.
    fn io_error(&self, video: &str, e: &std::io::Error) -> DatasetError {
        let (dataset, video, reason) = (self.name.clone(), video.to_owned(), e.to_string());
        match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => DatasetError::Unreadable {
                dataset,
                video,
                reason,
            },
            _ => DatasetError::Io {
                dataset,
                video,
                reason,
            },
        }
    }

    /// `msg` with this dataset's root dropped from the paths it quotes (`corrupt media "a/b.mp4"`).
    pub fn relative_message(&self, msg: &str) -> String {
        msg.replace(&quoted_root(&self.root), "\"")
    }

    /// Opens a dataset root; the directory must exist.
    pub fn new(name: &str, root: &Path) -> std::io::Result<Dataset> {
        let given = std::path::absolute(root)?;
        let root = root.canonicalize()?;
        if !root.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!("{} is not a directory", root.display()),
            ));
        }
        let dir = open_root(&root)?;
        Ok(Dataset {
            name: name.to_owned(),
            root,
            given,
            dir: Arc::new(parking_lot::RwLock::new(HeldRoot::new(dir))),
        })
    }

    /// The root as configured, when it is reached through a symlink (it is not the canonical root).
    pub fn given_through_symlink(&self) -> Option<&Path> {
        (self.given != self.root).then_some(&self.given)
    }

    /// Where the configured root leads now, when that is not the directory served: a symlink on its
    /// way flipped since the start (`current -> v2`). The daemon keeps serving the directory it
    /// resolved at start, until it restarts.
    pub fn root_moved(&self) -> Option<PathBuf> {
        self.given_through_symlink()?;
        let now = self.given.canonicalize().ok()?;
        (now != self.root).then_some(now)
    }

    /// The root's descriptor, opened again when the root's path now names another directory: renamed
    /// and made again, removed and made again, or mounted over. Holding the first one for good split the
    /// daemon in two: walks (by path) listed the new directory while opens (beneath the descriptor) read
    /// the old one, serving its pixels for names both held, silently. The new one is opened from `/`
    /// without following any symlink ([`open_root`]); a root gone, now a symlink or not a directory, or
    /// reached through a symlink keeps the held descriptor (opens beneath it find what is left). Costs an
    /// `lstat` per open.
    fn root_dir(&self) -> Arc<HeldRoot> {
        use std::os::unix::fs::MetadataExt;
        let held = self.dir.read().clone();
        let replaced = match (held.node, std::fs::symlink_metadata(&self.root)) {
            (Some(node), Ok(m)) => m.is_dir() && (m.dev(), m.ino()) != node,
            _ => false,
        };
        if !replaced {
            return held;
        }
        let fresh = match open_root(&self.root) {
            Ok(fd) => HeldRoot::new(fd),
            Err(e) => {
                tracing::warn!(dataset = %self.name, root = %self.root.display(), error = %e, "the dataset root names another directory now, which cannot be opened without following a symlink; still reading the one opened before");
                return held;
            }
        };
        if fresh.node == held.node {
            return held;
        }
        let mut w = self.dir.write();
        if Arc::ptr_eq(&w, &held) {
            tracing::warn!(dataset = %self.name, root = %self.root.display(), "the dataset root names another directory now (renamed over, made again or mounted over); serving the new one");
            *w = fresh;
        }
        w.clone()
    }

    /// Resolves a client's relative video path (as [`Dataset::resolve`]) and opens the file it names
    /// beneath the root, refusing anything but a regular file.
    pub fn open(&self, video: &str) -> Result<CheckedFile, DatasetError> {
        let (path, _) = self.resolve(video)?;
        self.open_resolved(video, &path)
    }

    /// Opens `path` (canonical, under the root, as [`Dataset::resolve`] returned it) beneath the root's
    /// descriptor without following any symlink: if a component was swapped for a symlink since the
    /// check, the open fails ([`DatasetError::Outside`]). `video` is the client's name, for messages.
    pub fn open_resolved(&self, video: &str, path: &Path) -> Result<CheckedFile, DatasetError> {
        self.open_beneath(video, path, !OPENAT2_MISSING.load(Ordering::Relaxed))
    }

    fn open_beneath(
        &self,
        video: &str,
        path: &Path,
        use_openat2: bool,
    ) -> Result<CheckedFile, DatasetError> {
        let rel = path
            .strip_prefix(&self.root)
            .map_err(|_| DatasetError::Outside {
                dataset: self.name.clone(),
                video: video.to_owned(),
            })?;
        let not_a_file = |kind: &str| DatasetError::NotAFile {
            dataset: self.name.clone(),
            video: video.to_owned(),
            kind: kind.to_owned(),
        };
        let normal: Vec<&std::ffi::OsStr> = rel
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(Ok(n)),
                Component::CurDir => None,
                _ => Some(Err(())),
            })
            .collect::<Result<_, _>>()
            .map_err(|()| DatasetError::Outside {
                dataset: self.name.clone(),
                video: video.to_owned(),
            })?;
        if normal.is_empty() {
            return Err(not_a_file("a directory"));
        }
        let dir = self.root_dir();
        let opened = if use_openat2 {
            match openat2_beneath(dir.fd.as_raw_fd(), rel) {
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
                    // No openat2 (kernel before 5.6, or a seccomp filter that refuses it).
                    OPENAT2_MISSING.store(true, Ordering::Relaxed);
                    tracing::info!(error = %e, "openat2 unavailable; opening videos by an O_NOFOLLOW walk");
                    walk_beneath(dir.fd.as_raw_fd(), &normal)
                }
                other => other,
            }
        } else {
            walk_beneath(dir.fd.as_raw_fd(), &normal)
        };
        let file = opened.map_err(|e| match e.raw_os_error() {
            // A symlink (or magic link) on the way, or a path leaving the root.
            Some(libc::ELOOP) | Some(libc::EXDEV) => DatasetError::Outside {
                dataset: self.name.clone(),
                video: video.to_owned(),
            },
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => DatasetError::NotFound {
                dataset: self.name.clone(),
                video: video.to_owned(),
            },
            _ => self.io_error(video, &e),
        })?;
        CheckedFile::from_file(path, file).map_err(|kind| not_a_file(&kind))
    }

    /// Resolves a client's relative video path to a file under the root, with its metadata.
    pub fn resolve(&self, video: &str) -> Result<(PathBuf, std::fs::Metadata), DatasetError> {
        let outside = || DatasetError::Outside {
            dataset: self.name.clone(),
            video: video.to_owned(),
        };
        let bad = |why| DatasetError::BadPath {
            video: video.to_owned(),
            why,
        };
        if video.is_empty() {
            return Err(bad("is empty"));
        }
        if video.contains('\0') {
            return Err(bad("holds a NUL byte"));
        }
        let rel = Path::new(video);
        for comp in rel.components() {
            match comp {
                Component::Normal(_) | Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => {
                    return Err(DatasetError::Absolute {
                        dataset: self.name.clone(),
                        video: video.to_owned(),
                    })
                }
                Component::ParentDir => return Err(outside()),
            }
        }
        let joined = self.root.join(rel);
        let canonical = joined.canonicalize().map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => DatasetError::NotFound {
                dataset: self.name.clone(),
                video: video.to_owned(),
            },
            // The dataset's own symlinks go round in a circle: nothing to read at this path, and
            // nothing the daemon can fix (a client error, not an internal one logged per request).
            Some(libc::ELOOP) => DatasetError::NotAFile {
                dataset: self.name.clone(),
                video: video.to_owned(),
                kind: "a symbolic-link loop".into(),
            },
            Some(libc::ENAMETOOLONG) => {
                bad("is too long for the file system (over 4096 bytes, or a name over 255)")
            }
            _ => self.io_error(video, &e),
        })?;
        if !canonical.starts_with(&self.root) {
            return Err(outside());
        }
        let meta = std::fs::metadata(&canonical).map_err(|e| self.io_error(video, &e))?;
        if !meta.is_file() {
            return Err(DatasetError::NotAFile {
                dataset: self.name.clone(),
                video: video.to_owned(),
                kind: kind_of(&meta).to_owned(),
            });
        }
        Ok((canonical, meta))
    }

    /// Counts video files under the root (by extension; symlinks are not followed).
    pub fn count_videos(&self) -> u64 {
        walk_videos(&self.root).len() as u64
    }
}

pub fn is_video(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| VIDEO_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_that_leave_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.mp4"), b"x").unwrap();
        std::fs::write(dir.path().join("secret.mp4"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret.mp4"), root.join("link.mp4")).unwrap();
        std::os::unix::fs::symlink(root.join("sub/a.mp4"), root.join("inside.mp4")).unwrap();
        let ds = Dataset::new("d", &root).unwrap();
        assert!(ds.resolve("sub/a.mp4").is_ok());
        assert!(ds.resolve("./sub/a.mp4").is_ok());
        assert!(ds.resolve("inside.mp4").is_ok());
        // Absolute, even under the root: refused, and quoted so that the message to the client (which
        // drops the root from quoted paths) keeps it absolute (probe B).
        let under = root.join("sub/a.mp4").display().to_string();
        for abs in ["/etc/passwd", under.as_str()] {
            let e = ds.resolve(abs).unwrap_err();
            assert!(matches!(e, DatasetError::Absolute { .. }), "{abs}: {e:?}");
            assert!(e
                .to_string()
                .starts_with(&format!("video path {abs} is absolute")));
            assert_eq!(
                crate::error::Error::from(e).code(),
                crate::error::Code::PermissionDenied
            );
        }
        // Refused by file modes (a daemon not root, a file or directory of mode 000): the operator's
        // doing, PERMISSION_DENIED, not INTERNAL (probe B).
        let denied = ds.io_error(
            "sub/a.mp4",
            &std::io::Error::from_raw_os_error(libc::EACCES),
        );
        assert!(
            matches!(denied, DatasetError::Unreadable { .. }),
            "{denied:?}"
        );
        assert_eq!(
            crate::error::Error::from(denied).code(),
            crate::error::Code::PermissionDenied
        );
        let other = ds.io_error("sub/a.mp4", &std::io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(
            crate::error::Error::from(other).code(),
            crate::error::Code::Internal
        );
        for bad in ["../secret.mp4", "sub/../../secret.mp4", "link.mp4"] {
            assert!(
                matches!(ds.resolve(bad), Err(DatasetError::Outside { .. })),
                "{bad}: {:?}",
                ds.resolve(bad)
            );
        }
        assert!(matches!(
            ds.resolve("nope.mp4"),
            Err(DatasetError::NotFound { .. })
        ));
        assert!(matches!(
            ds.resolve("sub"),
            Err(DatasetError::NotAFile { .. })
        ));
        assert!(matches!(ds.resolve(""), Err(DatasetError::BadPath { .. })));
        // Why a path is bad, said after at most 200 of its characters (a 5,000-character path filled
        // the message and its reason was cut off: probe D).
        let msg = |video: &str| ds.resolve(video).unwrap_err().to_string();
        assert_eq!(msg("a\0b"), r#"video path "a\0b" holds a NUL byte"#);
        let long = msg(&"x".repeat(5000));
        assert!(
            long.ends_with("... (5000 bytes) is too long for the file system (over 4096 bytes, or a name over 255)")
                && long.len() < 400,
            "{long}"
        );
        let far = msg(&format!("{}/../../x.mp4", "d".repeat(300)));
        assert!(far.contains("... (312 bytes) leaves dataset"), "{far}");
        assert_eq!(ds.count_videos(), 1);
    }

    /// A root with `sub/a.mp4` inside and a different `a.mp4` in a directory outside it.
    fn swap_fixture() -> (tempfile::TempDir, PathBuf, Dataset) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.mp4"), b"inside").unwrap();
        std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
        std::fs::write(dir.path().join("elsewhere/a.mp4"), b"OUTSIDE").unwrap();
        let ds = Dataset::new("d", &root).unwrap();
        (dir, root, ds)
    }

    fn contents(f: &CheckedFile) -> Vec<u8> {
        use std::io::Read;
        let mut out = Vec::new();
        (&f.file).read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_after_the_check_is_not_followed() {
        for use_openat2 in [true, false] {
            let (dir, root, ds) = swap_fixture();
            // Checked and opened at once: the inside file.
            let f = ds.open("sub/a.mp4").unwrap();
            assert_eq!(contents(&f), b"inside");
            assert_eq!((f.size, f.path.clone()), (6, root.join("sub/a.mp4")));
            // Checked, then `sub` becomes a symlink to a directory outside, then opened.
            let before = ds.open("sub/a.mp4").unwrap();
            let (checked, _) = ds.resolve("sub/a.mp4").unwrap();
            std::fs::rename(root.join("sub"), dir.path().join("old-sub")).unwrap();
            std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("sub")).unwrap();
            // Opening by name now reads the outside file: what the check must prevent.
            assert_eq!(std::fs::read(&checked).unwrap(), b"OUTSIDE");
            let got = ds.open_beneath("sub/a.mp4", &checked, use_openat2);
            assert!(
                matches!(got, Err(DatasetError::Outside { .. })),
                "openat2 {use_openat2}: {got:?}"
            );
            // The descriptor opened before the swap still reads what was checked.
            assert_eq!(contents(&before), b"inside");
        }
    }

    #[test]
    fn a_fifo_or_directory_is_refused_at_once_naming_the_path() {
        let (_dir, root, ds) = swap_fixture();
        let fifo = root.join("pipe.mp4");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid path; mkfifo has no other preconditions.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        for use_openat2 in [true, false] {
            let started = std::time::Instant::now();
            // Nobody writes the FIFO: a blocking open would never return.
            let got = ds.open_beneath("pipe.mp4", &fifo, use_openat2);
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
            let e = got.unwrap_err();
            assert!(
                matches!(&e, DatasetError::NotAFile { kind, .. } if kind == "a FIFO"),
                "{e:?}"
            );
            assert!(e.to_string().contains("\"pipe.mp4\""), "{e}");
            let got = ds.open_beneath("sub", &root.join("sub"), use_openat2);
            assert!(
                matches!(&got, Err(DatasetError::NotAFile { kind, .. }) if kind == "a directory"),
                "{got:?}"
            );
        }
        // Through the public entry point too (resolve's stat already says FIFO).
        assert!(matches!(
            ds.open("pipe.mp4"),
            Err(DatasetError::NotAFile { .. })
        ));
        // A symlink inside the root to a file inside it still opens (through its canonical path).
        std::os::unix::fs::symlink(root.join("sub/a.mp4"), root.join("alias.mp4")).unwrap();
        assert_eq!(contents(&ds.open("alias.mp4").unwrap()), b"inside");
    }

    /// The root is opened again when its path names another directory, but never through a symlink: a
    /// parent of the root swapped for a link to elsewhere is not followed (an open that skips the path
    /// check still reads the held root, never the outside file).
    #[test]
    fn a_replaced_root_is_opened_again_but_never_through_a_symlink() {
        let top = tempfile::tempdir().unwrap();
        let base = top.path().join("base");
        let root = base.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("v.mp4"), b"first").unwrap();
        let ds = Dataset::new("d", &root).unwrap();
        let root = ds.root.clone();
        let read = |ds: &Dataset| {
            let f = ds.open_resolved("v.mp4", &root.join("v.mp4"));
            f.map(|f| std::fs::read(f.proc_path()).unwrap())
        };
        assert_eq!(read(&ds).unwrap(), b"first");
        // Made again: the new directory is served.
        std::fs::rename(&root, base.join("old")).unwrap();
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("v.mp4"), b"second").unwrap();
        assert_eq!(read(&ds).unwrap(), b"second");
        // A parent swapped for a symlink to a tree holding a root of its own: not followed.
        let evil = top.path().join("evil");
        std::fs::create_dir_all(evil.join("root")).unwrap();
        std::fs::write(evil.join("root/v.mp4"), b"outside").unwrap();
        std::fs::rename(&base, top.path().join("base.real")).unwrap();
        std::os::unix::fs::symlink(&evil, &base).unwrap();
        assert_eq!(read(&ds).unwrap(), b"second", "the held root is kept");
        assert!(open_root(&root).is_err(), "open_root followed a symlink");
        assert!(ds.open("v.mp4").is_err(), "resolve still refuses the path");
    }
}
