//! This instance's directory of arenas: made locked, and made again if something removes it.
//!
//! Someone removing `--shm-dir/vserve-<pid>-<random>` under a running daemon (a cleanup script, a `rm -rf
//! /dev/shm/*`) left every later reply failing INTERNAL "cannot create shared-memory arena" (logged as an
//! ERROR each time) until a restart, and the first one after it handed out a pooled arena whose file was
//! gone. Replies and streams now check the directory first: gone, it is made again (mode 0710, or 0711 as root, locked as
//! at start-up) and the pools, whose files went with it, are emptied. A directory at that path that is
//! not this daemon's own (another owner, a symlink, writable by others: the name is known to clients, and
//! the parent is world-writable) is refused, never used.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::{ShmError, ShmRegistry};
use crate::peer::Peer;

/// Makes `dir` ([`dir_mode`]) holding a locked `.lock`: set up under a name no sweep considers, locked,
/// then renamed into place, so another instance never sees the directory without its lock held.
pub(super) fn make_locked(parent: &Path, dir: &Path) -> std::io::Result<std::fs::File> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let setup = parent.join(format!(".{name}.setup"));
    std::fs::DirBuilder::new().mode(dir_mode()).create(&setup)?;
    let locked = (|| {
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(setup.join(".lock"))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        std::fs::rename(&setup, dir)?;
        Ok(lock)
    })();
    if locked.is_err() {
        let _ = std::fs::remove_dir_all(&setup);
    }
    locked
}

/// The directory's mode: nobody but the daemon may list or write in it. Who may pass through it to
/// open a file whose name they were told: the daemon's group (0710), whose members its 0640 files are
/// for; and everyone when the daemon runs as root (0711), which hands each client a 0600 file of its
/// own uid: with 0710 a root daemon's clients of any other user could not reach their own files.
pub(super) fn dir_mode() -> u32 {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        0o711
    } else {
        0o710
    }
}

/// Whether `dir` is this process's own directory: a directory (not a symlink), of our user, that no one
/// else may list or write in ([`dir_mode`], less what the umask took).
fn is_ours(dir: &Path) -> std::io::Result<bool> {
    let m = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    Ok(m.is_dir() && m.uid() == me && m.permissions().mode() & 0o066 == 0)
}

impl ShmRegistry {
    /// Whether `peer` can open the files this daemon makes for it ([`ShmRegistry::access_for`]): a root
    /// daemon hands each client its own file, and a client of the daemon's user (or root) opens it; a
    /// daemon of another user makes 0640 files in its 0710 directory, which only members of their
    /// groups can reach. A client outside them would be sent a name it cannot open (EACCES), so its
    /// shared-memory requests are answered inline. Unknown groups (a TCP client, an unseen pid)
    /// count as reachable: the client then learns from open(2), as before.
    pub fn reachable_by(&self, peer: &Peer) -> bool {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let uid = match peer.uid {
            Some(uid) if euid != 0 && uid != euid && uid != 0 => uid,
            _ => return true,
        };
        let Some(groups) = peer.groups() else {
            return true;
        };
        let Ok(dir) = std::fs::metadata(&self.dir) else {
            return true; // made again at the reply (ensure_dir), or refused there with its reason
        };
        // A new file takes the directory's group where it is set-group-ID, else the daemon's.
        // SAFETY: getegid has no preconditions.
        let file_gid = if dir.mode() & libc::S_ISGID != 0 {
            dir.gid()
        } else {
            unsafe { libc::getegid() }
        };
        let reachable = groups.contains(&dir.gid()) && groups.contains(&file_gid);
        if !reachable {
            tracing::debug!(
                uid,
                ?groups,
                dir_gid = dir.gid(),
                file_gid,
                "shared memory unreachable for the client"
            );
        }
        reachable
    }

    /// Checks that this instance's directory is still there, making it again if it is gone (one
    /// `lstat` per reply or stream).
    pub(super) fn ensure_dir(&self) -> Result<(), ShmError> {
        let refuse = |reason: String| ShmError::Create {
            path: self.dir.display().to_string(),
            reason,
        };
        match is_ours(&self.dir) {
            Ok(true) => return Ok(()),
            Ok(false) => {
                return Err(refuse(
                    "the path holds something other than this daemon's own directory (its user's, writable by no one else); shared memory is refused until it is removed".into(),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(refuse(e.to_string())),
        }
        let mut lock = self.lock.lock();
        if is_ours(&self.dir).unwrap_or(false) {
            return Ok(());
        }
        let fresh = make_locked(&self.parent, &self.dir).map_err(|e| refuse(e.to_string()))?;
        *lock = Some(fresh);
        self.spare.lock().clear();
        self.stream_spare.lock().clear();
        tracing::warn!(dir = %self.dir.display(), "the shared-memory directory was removed under the daemon; made again (replies whose files went with it fail; new ones are served)");
        Ok(())
    }
}
