//! A client that truncates its arena file cannot take the daemon down.
//!
//! An arena is a file its client may open for writing (its own file, or its own user's): a client that
//! truncates it (`ftruncate`, or `open(path, "w")` by mistake) leaves the daemon's shared mapping with
//! no pages behind it, and the daemon's next write there raises SIGBUS, which would kill the process
//! and every other tenant's calls with it. So every arena mapping is registered here ([`watch`]), and a
//! SIGBUS handler that finds the faulting address inside one replaces that whole mapping with anonymous
//! memory (`mmap(MAP_FIXED)`: the write that faulted goes on, into memory nobody reads) and marks it
//! [`broken`]. The arena's writer checks the mark once its slot is written and fails that call alone
//! ([`super::ShmError::Truncated`]). A SIGBUS anywhere else goes to the handler installed before this
//! one (the crash journal's, then the default: a core dump).
//!
//! The registry is a fixed table of atomics, read without locks by the handler: [`ENTRIES`] mappings at
//! once (each arena is one; beyond that an arena is still served, unprotected, with a warning).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// Arena mappings the handler can protect at once.
pub const ENTRIES: usize = 16_384;

struct Entry {
    start: AtomicUsize,
    len: AtomicUsize,
    broken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    broken: AtomicBool::new(false),
};
static TABLE: [Entry; ENTRIES] = [EMPTY; ENTRIES];

static INSTALL: Once = Once::new();
/// The SIGBUS action before ours, to which other faults go.
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();

/// A registered mapping; unregistered when dropped (before the mapping is unmapped).
#[derive(Debug)]
pub struct Watched(Option<usize>);

/// Registers the mapping `[start, start + len)` (page-aligned, as `mmap` returns it).
pub fn watch(start: *mut u8, len: usize) -> Watched {
    INSTALL.call_once(install);
    for (i, e) in TABLE.iter().enumerate() {
        if e.len
            .compare_exchange(0, len.max(1), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            e.broken.store(false, Ordering::Release);
            e.start.store(start as usize, Ordering::Release);
            return Watched(Some(i));
        }
    }
    tracing::warn!(
        entries = ENTRIES,
        "too many shared-memory arenas to guard against truncation; this one is not"
    );
    Watched(None)
}

/// Whether the handler found the mapping truncated under a write (its contents are then gone).
pub fn broken(w: &Watched) -> bool {
    w.0.is_some_and(|i| TABLE[i].broken.load(Ordering::Acquire))
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            TABLE[i].start.store(0, Ordering::Release);
            TABLE[i].len.store(0, Ordering::Release);
        }
    }
}

fn install() {
    // SAFETY: `PREVIOUS` is written here once, before the handler that reads it exists; `action` is a
    // zeroed sigaction filled in as sigaction(2) requires.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut action.sa_mask);
        let previous = std::ptr::addr_of_mut!(PREVIOUS).cast::<libc::sigaction>();
        if libc::sigaction(libc::SIGBUS, &action, previous) != 0 {
            tracing::warn!("cannot install the SIGBUS handler: a client truncating its arena file would crash the daemon");
        }
    }
}

/// The handler: atomics, `mmap` and `sigaction` only (system calls; no allocation, no locks).
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo; the replaced range is a live mapping of an arena
    // (registered until just before its unmap), so MAP_FIXED replaces only memory this module owns;
    // PREVIOUS was written by `install` before this handler could run.
    unsafe {
        let addr = (*info).si_addr() as usize;
        for e in TABLE.iter() {
            let start = e.start.load(Ordering::Acquire);
            let len = e.len.load(Ordering::Acquire);
            if start != 0 && addr >= start && addr < start + len {
                let p = libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                );
                if p != libc::MAP_FAILED {
                    e.broken.store(true, Ordering::Release);
                    return;
                }
            }
        }
        // Not an arena: the previous handler's business.
        let previous = &*std::ptr::addr_of!(PREVIOUS).cast::<libc::sigaction>();
        let h = previous.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // Default: put it back; the fault repeats and kills the process as before.
            libc::sigaction(sig, previous, std::ptr::null_mut());
            if (*info).si_code <= 0 {
                libc::raise(sig);
            }
        } else if previous.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(h);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
            f(sig);
        }
    }
}
