//! The journal's slot files on disk: what a dead process left in them ([`read_left`]) and new ones
//! ([`create`]).
//!
//! Anything at a `slot-N` name that is not a regular file (a FIFO, a directory: a damaged or hand-edited
//! state directory) is foreign: it holds no record, is logged and ignored. A FIFO is removed as the
//! slot files are; a directory only when it is empty (a tree is never deleted), and a new slot takes
//! the next free number instead of its name.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{FileKey, Pool};

/// New slot numbers tried past names something foreign holds before giving up.
const FOREIGN_NAMES: usize = 64;

/// The slot files a dead process left: to remove once their records are judged.
type Slots = Vec<PathBuf>;
/// The (state byte, file) of every busy or crashed record.
type Inside = Vec<(u8, FileKey)>;

/// The slot files of `dir` to remove once their records are judged, and the (state byte, file) of every
/// busy or crashed record among them.
pub(super) fn read_left(dir: &Path) -> std::io::Result<(Slots, Inside)> {
    let mut slots = Vec::new();
    let mut inside = Vec::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        if !e.file_name().to_string_lossy().starts_with("slot-") {
            continue;
        }
        let path = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            // remove_dir removes an empty directory only: what a tree holds is not the journal's.
            let removed = std::fs::remove_dir(&path).is_ok();
            tracing::warn!(slot = %path.display(), removed, "journal slot is a directory (a damaged state directory); ignored, removed only when empty");
            continue;
        }
        slots.push(path.clone());
        let read = crate::state::read_regular(&path);
        let Some(bytes) = read.map_err(|err| tracing::warn!(slot = %path.display(), error = %err, "journal slot unreadable (a damaged state directory); ignored and removed")).ok() else {
            continue;
        };
        match FileKey::parse_record(&bytes) {
            Some((state @ (b'B' | b'D' | b'C'), key)) => inside.push((state, key)),
            Some((b'S', key)) => {
                tracing::info!(path = %key.path.display(), "the previous daemon had a read of this file stuck past its deadline; not quarantined");
            }
            None if !bytes.is_empty() => {
                tracing::warn!(slot = %path.display(), "journal slot holds no record (a damaged state directory); ignored and removed");
            }
            _ => {}
        }
    }
    Ok((slots, inside))
}

/// A new slot file of `pool`, with its number: the next number whose name nothing foreign holds.
pub(super) fn create(pool: &Pool) -> std::io::Result<(usize, File)> {
    let mut tries = 0;
    loop {
        let n = pool.next.fetch_add(1, Ordering::Relaxed);
        let path = pool.dir.join(format!("slot-{n}"));
        let opened = crate::state::open_regular(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true),
            &path,
        );
        match opened {
            Ok((file, _)) => return Ok((n, file)),
            Err(e)
                if tries < FOREIGN_NAMES && path.symlink_metadata().is_ok_and(|m| !m.is_file()) =>
            {
                tracing::warn!(slot = %path.display(), error = %e, "journal slot name held by something not a file; using the next");
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
