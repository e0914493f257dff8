//! Walking a dataset root: every video file under it by extension (symlinks not followed), streamed,
//! and what the walk could not read ([`WalkTrouble`]), so callers keep what they knew under an
//! unreadable directory instead of taking it for a smaller dataset.

use std::path::{Path, PathBuf};

use super::is_video;

/// The video files under `root` (by extension; symlinks are not followed), in no particular order.
pub fn walk_videos(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let trouble = visit_videos(root, &mut |rel| found.push(root.join(rel)));
    if trouble.any() {
        tracing::warn!(root = %root.display(), "walk incomplete: {}", trouble.describe());
    }
    found
}

/// What a walk could not read. A walk that met an unreadable directory is incomplete: callers keep what
/// they knew before under it, or fail, rather than take it for a smaller dataset (an unreadable root
/// once listed as an empty one, and the daemon served nothing until the next walk).
///
/// Not incompleteness: a directory removed while the walk ran (ENOENT below the root: gone, not
/// unreadable), and one whose path is longer than the system opens (ENAMETOOLONG: nothing under it
/// can ever be opened by path, so it is left out, like names that are not UTF-8, and a single
/// too-deep directory does not freeze the whole dataset's list).
#[derive(Debug, Default)]
pub struct WalkTrouble {
    /// Directories `read_dir` failed on (the root included), and the first with its error.
    pub unreadable_dirs: u64,
    pub first_unreadable: Option<String>,
    /// The unreadable directories relative to the root ("" for the root itself), when every one of
    /// them is here (at most [`MAX_UNREADABLE_LISTED`], UTF-8 names); None otherwise.
    pub unreadable: Option<Vec<String>>,
    /// Video files whose names are not UTF-8 (never served: paths are strings), and the first.
    pub non_utf8: u64,
    pub first_non_utf8: Option<String>,
    /// Directories whose path is too long to open (ENAMETOOLONG), left out, and the first.
    pub too_long: u64,
    pub first_too_long: Option<String>,
}

/// The unreadable directories a walk names one by one; beyond them its callers keep everything.
pub const MAX_UNREADABLE_LISTED: usize = 1024;

/// How much of an example path a walk's message shows.
const EXAMPLE_CHARS: usize = 300;

impl WalkTrouble {
    /// Whether the walk read every directory.
    pub fn complete(&self) -> bool {
        self.unreadable_dirs == 0
    }

    /// One line for a log or an error: what was not read, and the first example.
    pub fn describe(&self) -> String {
        let kinds = [
            (
                self.unreadable_dirs,
                &self.first_unreadable,
                ("unreadable directory", "unreadable directories"),
            ),
            (
                self.non_utf8,
                &self.first_non_utf8,
                (
                    "video file with a name that is not UTF-8, left out",
                    "video files with a name that is not UTF-8, left out",
                ),
            ),
            (
                self.too_long,
                &self.first_too_long,
                (
                    "directory whose path is too long to open, left out",
                    "directories whose path is too long to open, left out",
                ),
            ),
        ];
        let parts: Vec<String> = kinds
            .into_iter()
            .filter_map(|(n, first, (one, many))| {
                let what = if n == 1 { one } else { many };
                Some(format!(
                    "{n} {what} (first: {})",
                    crate::refusal::quoted(first.as_ref()?, EXAMPLE_CHARS)
                ))
            })
            .collect();
        parts.join("; ")
    }

    /// Whether anything is worth a warning.
    pub fn any(&self) -> bool {
        !self.complete() || self.non_utf8 > 0 || self.too_long > 0
    }
}

/// Makes, under `root`, a chain of directories whose path passes PATH_MAX (4096 bytes) with a video at
/// its end: built relative to each directory's descriptor, since no path can name the deep ones.
#[cfg(test)]
pub(crate) fn make_too_long_dir(root: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = |s: &[u8]| std::ffi::CString::new(s).unwrap();
    let name = c(&[b'd'; 250]);
    // SAFETY: plain descriptor calls on NUL-terminated names; every descriptor opened is closed.
    unsafe {
        let mut fd = libc::open(
            c(root.as_os_str().as_bytes()).as_ptr(),
            libc::O_DIRECTORY | libc::O_RDONLY,
        );
        assert!(fd >= 0);
        for _ in 0..18 {
            assert_eq!(libc::mkdirat(fd, name.as_ptr(), 0o755), 0);
            let next = libc::openat(fd, name.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY);
            libc::close(fd);
            assert!(next >= 0);
            fd = next;
        }
        let f = libc::openat(
            fd,
            c(b"x.mp4").as_ptr(),
            libc::O_CREAT | libc::O_WRONLY,
            0o644,
        );
        assert!(f >= 0);
        libc::close(f);
        libc::close(fd);
    }
}

/// Calls `found` with the path relative to `root` of every video file under it (by extension; symlinks
/// not followed; names that are not UTF-8 skipped), in no particular order, and says what it could not
/// read. Streams: holds only the directories still to read, so a walk of a million files keeps none of
/// their paths.
pub fn visit_videos(root: &Path, found: &mut dyn FnMut(&str)) -> WalkTrouble {
    let mut trouble = WalkTrouble {
        unreadable: Some(Vec::new()),
        ..Default::default()
    };
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let failed = |trouble: &mut WalkTrouble, e: std::io::Error| {
            let below_root = dir != root;
            if below_root && e.kind() == std::io::ErrorKind::NotFound {
                return; // removed while the walk ran
            }
            if below_root && e.raw_os_error() == Some(libc::ENAMETOOLONG) {
                trouble.too_long += 1;
                trouble
                    .first_too_long
                    .get_or_insert_with(|| dir.display().to_string());
                return;
            }
            trouble.unreadable_dirs += 1;
            trouble
                .first_unreadable
                .get_or_insert_with(|| format!("{}: {e}", dir.display()));
            let rel = dir.strip_prefix(root).ok().and_then(|r| r.to_str());
            match (&mut trouble.unreadable, rel) {
                (Some(list), Some(rel)) if list.len() < MAX_UNREADABLE_LISTED => {
                    list.push(rel.to_owned())
                }
                _ => trouble.unreadable = None,
            }
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                failed(&mut trouble, e);
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    failed(&mut trouble, e);
                    break;
                }
            };
            let Ok(ft) = entry.file_type() else { continue };
            let path = entry.path();
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_file() && is_video(&path) {
                match path.strip_prefix(root).ok().and_then(|r| r.to_str()) {
                    Some(rel) => found(rel),
                    None => {
                        trouble.non_utf8 += 1;
                        trouble
                            .first_non_utf8
                            .get_or_insert_with(|| format!("{:?}", path.display().to_string()));
                    }
                }
            }
        }
    }
    trouble
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_leaves_out_a_directory_too_long_to_open_and_is_complete() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.mp4"), b"x").unwrap();
        make_too_long_dir(dir.path());
        let mut found = Vec::new();
        let trouble = visit_videos(dir.path(), &mut |rel| found.push(rel.to_owned()));
        assert_eq!(found, vec!["a.mp4".to_owned()]);
        assert!(trouble.complete(), "{trouble:?}");
        assert_eq!(trouble.too_long, 1, "{trouble:?}");
        let said = trouble.describe();
        assert!(
            said.starts_with("1 directory whose path is too long to open, left out (first: "),
            "{said}"
        );
        assert!(said.len() < 400, "the example path is cut: {said}");
    }
}
