//! The daemon's state directory: what the daemon learned and must not forget across restarts (frame
//! tables, dataset health, the poison-file journal). Never next to the user's videos.
//!
//! Input: the configured directory (`--state-dir`), or the default from [`default_dir`]. Output: a
//! [`StateDir`] handing out paths inside it and writing files atomically (temp file, fsync, rename), so a
//! crash leaves the old content or the new one, never a torn file. Everything in it is a cache of facts
//! about files: deleting the directory loses time, not data; a reader that finds a file it cannot trust
//! (wrong magic, version, size) ignores it with a warning.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The default state directory (see [`crate::config::default_state_dir`]).
pub fn default_dir() -> Option<PathBuf> {
    crate::config::default_state_dir()
}

/// An opened state directory (created 0700 if missing).
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn open(root: &Path) -> std::io::Result<StateDir> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)?;
        if !root.is_dir() {
            return Err(std::io::Error::other(format!(
                "{} is not a directory",
                root.display()
            )));
        }
        Ok(StateDir {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of `name` inside the directory (`name` is one of the daemon's own, never user input).
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Replaces `name` with `bytes` atomically: a reader sees the old file or the new one, whole.
    pub fn write_atomic(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let dest = self.path(name);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Unique per process and per write, so concurrent writers of one name never share a temp file.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = dest.with_file_name(format!(
            ".{}.tmp-{}-{}",
            dest.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id(),
            WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &dest)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// The bytes of `name`, or `None` when it does not exist.
    pub fn read(&self, name: &str) -> std::io::Result<Option<Vec<u8>>> {
        match read_regular(&self.path(name)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Opens `path` with `options` as a regular file only: `O_NONBLOCK` so that a FIFO (or a device) put in
/// the state directory cannot block the open, then refused by `fstat` unless it is a regular file. A FIFO
/// at a journal slot or `quarantine.json` held the daemon before it bound its socket, forever and silently;
/// one in place of a stored table held a request for the whole index deadline and a thread for good.
/// Returns the file with what `fstat` said of it.
pub fn open_regular(
    options: &mut std::fs::OpenOptions,
    path: &Path,
) -> std::io::Result<(std::fs::File, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = options
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ENXIO) {
                // A FIFO opened for writing with no reader, or a socket.
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{} is a FIFO or a socket, not a regular file",
                        path.display()
                    ),
                )
            } else {
                e
            }
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is {}, not a regular file",
                path.display(),
                kind_of(&meta)
            ),
        ));
    }
    Ok((file, meta))
}

/// What a file is, for messages ("a directory", "a symlink", ...).
pub fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_symlink() {
        "a symlink"
    } else {
        "not a regular file"
    }
}

/// The whole contents of the regular file at `path` ([`open_regular`]).
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let (mut file, _) = open_regular(std::fs::OpenOptions::new().read(true), path)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_whole_files_and_missing_reads_are_none() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(&dir.path().join("a/b")).unwrap();
        assert_eq!(state.read("x").unwrap(), None);
        state.write_atomic("x", b"first").unwrap();
        state.write_atomic("x", b"second, longer").unwrap();
        assert_eq!(state.read("x").unwrap().unwrap(), b"second, longer");
        state.write_atomic("sub/y", b"1").unwrap();
        assert_eq!(state.read("sub/y").unwrap().unwrap(), b"1");
        // No temp files left behind.
        let names: Vec<_> = std::fs::read_dir(state.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(state.root())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
