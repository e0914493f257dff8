//! Telling a crash from a kill: the journal's record of the thread that crashed.
//!
//! A busy journal record says a thread was inside a file when the process died, not why it died. A
//! decoder crash (a fault or an abort inside FFmpeg) and an outside kill (the OOM killer, `systemctl kill`,
//! a supervisor's SIGKILL) leave the same records, and only the first is the file's fault. So the
//! process installs a handler for the signals a crash raises (SIGSEGV, SIGBUS, SIGILL, SIGFPE, and SIGABRT
//! raised by the process itself): it turns the state byte of the crashing thread's record from busy to
//! `C` with one `pwrite` (async-signal-safe), and lets the signal take its course: a fault repeats for
//! the previous handler, put back; a sent signal is raised again with the default action. So core dumps,
//! Rust's stack-overflow message and exit statuses are unchanged. [`super::recover`] then knows which file crashed the process,
//! and that the files other threads were inside were bystanders.
//!
//! Each thread's record is named by [`INSIDE`]: the descriptor of the slot it is inside a file with,
//! set by [`super::JournalSlot::enter`] and cleared by `leave`, on the thread that decodes.

use std::cell::Cell;
use std::sync::Once;

/// Signals a crash of this process raises.
const FATAL: [libc::c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
];

thread_local! {
    /// The descriptor of the journal slot whose record names the file this thread is inside (-1:
    /// none). Const-initialised with no destructor: reading it is a plain TLS load, safe in a handler.
    static INSIDE: Cell<libc::c_int> = const { Cell::new(-1) };
}

/// The handlers in place before [`install`], restored by the handler before the signal goes on.
static mut PREVIOUS: [std::mem::MaybeUninit<libc::sigaction>; 5] =
    [const { std::mem::MaybeUninit::uninit() }; 5];
static INSTALL: Once = Once::new();

/// Records that this thread is now inside the file its slot `fd` names.
pub fn set_inside(fd: libc::c_int) {
    INSIDE.with(|c| c.set(fd));
}

/// Records that this thread left the file its slot `fd` names. A slot left on another thread than the
/// one that entered it leaves that thread's mark alone (slots are entered and left on the thread that
/// decodes; the pool keeps their descriptors open for the process's life, so a stale mark never names a
/// descriptor reused for another file).
pub fn set_left(fd: libc::c_int) {
    INSIDE.with(|c| {
        if c.get() == fd {
            c.set(-1)
        }
    });
}

/// Installs the handler once per process (the first journal's recovery).
pub fn install() {
    INSTALL.call_once(|| {
        for (i, &sig) in FATAL.iter().enumerate() {
            // SAFETY: `PREVIOUS` is written only here, once, before the handler that reads it is
            // installed; `action` is a zeroed sigaction filled in as sigaction(2) requires.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_fatal as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let previous = std::ptr::addr_of_mut!(PREVIOUS[i]).cast::<libc::sigaction>();
                if libc::sigaction(sig, &action, previous) != 0 {
                    tracing::warn!(
                        signal = sig,
                        "cannot install the crash handler: a crash will read as a kill"
                    );
                }
            }
        }
    });
}

/// The signal handler: only async-signal-safe calls (a TLS read, `pwrite`, `getpid`, `sigaction`,
/// `raise`).
extern "C" fn on_fatal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; `PREVIOUS[i]` was written by
    // `install` before this handler could run; pwrite, getpid, sigaction and raise are
    // async-signal-safe.
    unsafe {
        let code = (*info).si_code;
        // A fault the kernel raised (si_code > 0), or a signal this process sent itself (abort()).
        let crashed = code > 0 || (*info).si_pid() == libc::getpid();
        let fd = INSIDE.with(|c| c.get());
        if crashed && fd >= 0 {
            libc::pwrite(fd, b"C".as_ptr().cast(), 1, 0);
        }
        // A fault repeats when the handler returns, for the previous handler (Rust's stack-overflow
        // report, or the default action). A sent signal (abort's, or another process's `kill -SEGV`)
        // does not repeat: it is raised again with the default action. Given to a previous handler
        // that only resets itself and returns, as Rust's does for an address outside a guard page, it
        // ended there, and the daemon ran on (probe G7).
        if code <= 0 {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &default, std::ptr::null_mut());
            libc::raise(sig);
        } else if let Some(i) = FATAL.iter().position(|&s| s == sig) {
            let previous = std::ptr::addr_of!(PREVIOUS[i]).cast::<libc::sigaction>();
            libc::sigaction(sig, previous, std::ptr::null_mut());
        }
    }
}
