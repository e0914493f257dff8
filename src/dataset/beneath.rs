//! Opening beneath a dataset's root descriptor: `openat2` with `RESOLVE_BENEATH`, or an `O_NOFOLLOW` walk
//! one component at a time where the kernel has none; the root's own descriptor.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// Set once `openat2` turned out missing: every later open walks.
pub(super) static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

/// Flags of every video open: read-only, never blocking (a FIFO opens at once and is then refused by
/// `fstat`), no controlling terminal, closed on exec.
pub(super) const OPEN_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

/// (device, inode) of an open descriptor (`O_PATH` ones included).
pub(super) fn node_of(fd: libc::c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes the zeroed struct given, for a descriptor the caller holds open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// The canonical root `root` opened `O_PATH`, walking from `/` one component at a time with
/// `O_NOFOLLOW | O_DIRECTORY`: a symlink anywhere on the way (a parent swapped for a link to elsewhere)
/// fails the open instead of being followed.
pub(super) fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    let step = |at: libc::c_int, name: &[u8]| -> std::io::Result<OwnedFd> {
        let c = std::ffi::CString::new(name).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "root path holds a NUL")
        })?;
        // SAFETY: `at` is an open descriptor (or AT_FDCWD), `c` a valid NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                at,
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by openat and is owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    if !root.is_absolute() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "root path is not absolute",
        ));
    }
    let mut dir = step(libc::AT_FDCWD, b"/")?;
    for comp in root.components() {
        match comp {
            std::path::Component::RootDir => {}
            std::path::Component::Normal(name) => dir = step(dir.as_raw_fd(), name.as_bytes())?,
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "root path is not canonical",
                ))
            }
        }
    }
    Ok(dir)
}

/// `openat2(dir, rel, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`.
pub(super) fn openat2_beneath(dir: libc::c_int, rel: &Path) -> std::io::Result<File> {
    let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain integers; all-zero is a valid value (no flags, no mode, no resolve).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = OPEN_FLAGS as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: `dir` is an open descriptor, `c` a valid NUL-terminated path, `how` a valid open_how
        // whose size is passed with it; the kernel only reads them.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor just returned by openat2, owned by nothing else.
            return Ok(unsafe { File::from_raw_fd(fd as libc::c_int) });
        }
        let e = std::io::Error::last_os_error();
        // EAGAIN: a concurrent rename made the kernel unsure the walk stayed beneath; try again.
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
            return Err(e);
        }
    }
}

/// The same without openat2: one `openat(O_NOFOLLOW)` per component, directories as `O_PATH`.
pub(super) fn walk_beneath(
    root: libc::c_int,
    components: &[&std::ffi::OsStr],
) -> std::io::Result<File> {
    let mut held: Option<OwnedFd> = None;
    for (i, comp) in components.iter().enumerate() {
        let c = std::ffi::CString::new(comp.as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let last = i + 1 == components.len();
        let flags = if last {
            OPEN_FLAGS | libc::O_NOFOLLOW
        } else {
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC
        };
        let at = held.as_ref().map_or(root, |d| d.as_raw_fd());
        // SAFETY: `at` is an open directory descriptor, `c` a valid NUL-terminated name.
        let fd = unsafe { libc::openat(at, c.as_ptr(), flags) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOTDIR) && is_symlink_at(at, &c) {
                // A directory swapped for a symlink: O_NOFOLLOW|O_DIRECTORY says ENOTDIR.
                return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
            }
            return Err(e);
        }
        // SAFETY: a descriptor just returned by openat, owned by nothing else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        if last {
            return Ok(File::from(owned));
        }
        held = Some(owned);
    }
    Err(std::io::Error::from_raw_os_error(libc::ENOENT))
}

pub(super) fn is_symlink_at(dir: libc::c_int, name: &std::ffi::CStr) -> bool {
    // SAFETY: an all-zero stat is a valid value for fstatat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open descriptor, `name` a valid C string, `st` a writable stat.
    let ret = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    ret == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFLNK
}
