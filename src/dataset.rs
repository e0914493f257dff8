//! Datasets: a name and a root directory. Clients name a video by its path relative to the root.
//!
//! Invariant: nothing outside the root is ever opened. A path is refused before touching the file
//! system when it is absolute, empty, or has a `..`/root/prefix component; after canonicalisation (which
//! resolves symlinks) it is refused again unless it still lies under the canonical root.

use std::path::{Component, Path, PathBuf};

/// Extensions counted as videos when a dataset root is scanned.
pub const VIDEO_EXTENSIONS: &[&str] = &[
    "mp4", "m4v", "mov", "mkv", "webm", "avi", "mpeg", "mpg", "ts", "flv", "3gp", "ogv", "wmv",
];

#[derive(Clone, Debug)]
pub struct Dataset {
    pub name: String,
    /// Canonical root directory.
    pub root: PathBuf,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DatasetError {
    #[error("video path {0:?} is empty or not valid")]
    BadPath(String),
    #[error("video path {video:?} leaves dataset {dataset:?}")]
    Outside { dataset: String, video: String },
    #[error("video {video:?} not in dataset {dataset:?}")]
    NotFound { dataset: String, video: String },
    #[error("video {video:?} in dataset {dataset:?} is not a regular file")]
    NotAFile { dataset: String, video: String },
    #[error("cannot read {video:?} in dataset {dataset:?}: {reason}")]
    Io {
        dataset: String,
        video: String,
        reason: String,
    },
}

impl Dataset {
    /// Opens a dataset root; the directory must exist.
    pub fn new(name: &str, root: &Path) -> std::io::Result<Dataset> {
        let root = root.canonicalize()?;
        if !root.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!("{} is not a directory", root.display()),
            ));
        }
        Ok(Dataset {
            name: name.to_owned(),
            root,
        })
    }

    /// Resolves a client's relative video path to a file under the root, with its metadata.
    pub fn resolve(&self, video: &str) -> Result<(PathBuf, std::fs::Metadata), DatasetError> {
        let outside = || DatasetError::Outside {
            dataset: self.name.clone(),
            video: video.to_owned(),
        };
        if video.is_empty() || video.contains('\0') {
            return Err(DatasetError::BadPath(video.to_owned()));
        }
        let rel = Path::new(video);
        for comp in rel.components() {
            match comp {
                Component::Normal(_) | Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(outside())
                }
            }
        }
        let joined = self.root.join(rel);
        let canonical = joined.canonicalize().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DatasetError::NotFound {
                dataset: self.name.clone(),
                video: video.to_owned(),
            },
            _ => DatasetError::Io {
                dataset: self.name.clone(),
                video: video.to_owned(),
                reason: e.to_string(),
            },
        })?;
        if !canonical.starts_with(&self.root) {
            return Err(outside());
        }
        let meta = std::fs::metadata(&canonical).map_err(|e| DatasetError::Io {
            dataset: self.name.clone(),
            video: video.to_owned(),
            reason: e.to_string(),
        })?;
        if !meta.is_file() {
            return Err(DatasetError::NotAFile {
                dataset: self.name.clone(),
                video: video.to_owned(),
            });
        }
        Ok((canonical, meta))
    }

    /// Counts video files under the root (by extension; symlinks are not followed).
    pub fn count_videos(&self) -> u64 {
        walk_videos(&self.root).len() as u64
    }
}

/// The video files under `root` (by extension; symlinks are not followed), in no particular order.
pub fn walk_videos(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            let path = entry.path();
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_file() && is_video(&path) {
                found.push(path);
            }
        }
    }
    found
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
        for bad in [
            "../secret.mp4",
            "/etc/passwd",
            "sub/../../secret.mp4",
            "link.mp4",
        ] {
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
        assert!(matches!(ds.resolve(""), Err(DatasetError::BadPath(_))));
        assert_eq!(ds.count_videos(), 1);
    }
}
