//! The start-up sweep: what daemons no longer running left in the shm directory (instance directories
//! whose lock nobody holds, or that lost their lock with their daemon gone; files of the older layout
//! whose pid is not running); and at shutdown, the arenas sent to clients that have not mapped them yet
//! ([`ShmRegistry::unmapped_sent`]), which the daemon waits for before it removes its directory.

use std::os::fd::AsRawFd;
use std::path::Path;

use super::ShmRegistry;
use crate::peer::PeerKey;

impl ShmRegistry {
    /// Arenas holding replies or batches sent to a local client (GetClips replies not released, the
    /// arenas of streams) that the client's process, still running, has not mapped yet. The daemon's
    /// exit removes its arenas: one a client had not opened by then was lost with everything sent in it
    /// (a reply read a second after SIGTERM, or a stream's last batches before its "server is shutting
    /// down": probe G); a mapping outlives the file. Clients of no known process (TCP) are not waited for.
    pub fn unmapped_sent(&self) -> usize {
        let mut arenas: Vec<std::sync::Arc<super::Arena>> = self
            .one_shot
            .lock()
            .values()
            .map(|(a, _, _)| a.clone())
            .collect();
        arenas.extend(self.streams.lock().values().filter_map(|w| w.upgrade()));
        arenas.extend(self.retired.lock().values().map(|(a, _)| a.clone()));
        arenas
            .iter()
            .filter(|a| match a.owner_key() {
                PeerKey::Process { pid, .. } => {
                    match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
                        // Arena names are random: a line ending in one is that file mapped.
                        Ok(maps) => !maps.lines().any(|l| {
                            l.trim_end_matches(" (deleted)")
                                .rsplit('/')
                                .next()
                                .is_some_and(|n| n == a.name)
                        }),
                        Err(_) => false, // the process is gone
                    }
                }
                _ => false,
            })
            .count()
    }

    /// Removes what daemons no longer running left in the shm directory: directories whose lock nobody
    /// holds, and files of the older layout whose pid is not running. Returns how many.
    pub fn remove_stale(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.parent) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with("vserve-") || e.path() == self.dir {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if meta.is_dir() {
                if is_instance_name(name)
                    && (instance_is_gone(&e.path()) || lockless_and_dead(name, &e.path()))
                    && std::fs::remove_dir_all(e.path()).is_ok()
                {
                    removed += 1;
                }
                continue;
            }
            let Some(pid) = name
                .strip_prefix("vserve-")
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
            if !alive && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

/// Whether `name` is an instance directory's: `vserve-<pid>-<32 hex digits>`.
fn is_instance_name(name: &str) -> bool {
    let Some((pid, rand)) = name.strip_prefix("vserve-").and_then(|r| r.split_once('-')) else {
        return false;
    };
    !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && rand.len() == 32
        && rand.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether the instance directory `dir` was left by a daemon that is gone: it has the daemon's lock file
/// and nobody holds the lock. A directory without one is not ours to judge (another program's, or an
/// instance being set up this instant) and is left alone.
fn instance_is_gone(dir: &Path) -> bool {
    let Ok(lock) = std::fs::OpenOptions::new()
        .read(true)
        .open(dir.join(".lock"))
    else {
        return false;
    };
    // SAFETY: flock on a descriptor we own; the lock (if taken) goes when `lock` is closed.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Whether an instance directory lost its lock file and the pid in its name runs no process: left by a
/// daemon whose exit removed the lock but not every arena (before that was fixed, a reply still held at
/// shutdown). A live pid keeps it (it may be another daemon's, e.g. pid 1 in containers).
fn lockless_and_dead(name: &str, dir: &Path) -> bool {
    let pid = name
        .strip_prefix("vserve-")
        .and_then(|r| r.split('-').next())
        .and_then(|p| p.parse::<u32>().ok());
    !dir.join(".lock").exists()
        && pid
            .is_some_and(|p| p != std::process::id() && !Path::new(&format!("/proc/{p}")).exists())
}
