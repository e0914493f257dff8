//! Signals: SIGINT or SIGTERM resolve [`signal`] (the server fans it out to every listener so each stops
//! accepting and finishes the calls it has); SIGHUP runs a reload ([`on_hangup`]).
//!
//! [`install`] watches all three from the start of `vserve serve`, before the datasets are read: until a
//! signal is watched its default action applies, and a SIGHUP during start-up (logrotate's reload) killed
//! the daemon (exit 129), a SIGTERM ended it without its clean shutdown (143: probe G). What arrives before
//! the server is up is then acted on once it is: a stop drains at once, a reload runs.

use parking_lot::Mutex;
use tokio::signal::unix::{signal as watch, Signal, SignalKind};

/// The streams [`install`] made, taken by the first [`signal`] and [`on_hangup`].
struct Early {
    stop: Option<(Signal, Signal)>,
    hangup: Option<Signal>,
}

static EARLY: Mutex<Early> = Mutex::new(Early {
    stop: None,
    hangup: None,
});

const HANDLED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Blocks (`hold`) or unblocks the handled signals in the calling thread: `vserve serve` holds them
/// from its first instruction until [`install`] watches them, so one that arrives meanwhile waits,
/// pending, instead of taking its default action; threads started meanwhile keep them blocked, and the
/// main thread takes them once it releases them.
pub fn hold(hold: bool) {
    // SAFETY: a sigset_t filled by sigemptyset/sigaddset and given to pthread_sigmask for this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in HANDLED {
            libc::sigaddset(&mut set, s);
        }
        let how = if hold {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Watches SIGINT, SIGTERM and SIGHUP from now on (within a Tokio runtime). Logged when one cannot be.
pub fn install() {
    let mut early = EARLY.lock();
    match watch_stop() {
        Ok(stop) => early.stop = Some(stop),
        Err(e) => tracing::warn!(error = %e, "cannot watch SIGINT and SIGTERM at start-up"),
    }
    match watch(SignalKind::hangup()) {
        Ok(hup) => early.hangup = Some(hup),
        Err(e) => tracing::warn!(error = %e, "cannot watch SIGHUP at start-up"),
    }
}

/// Watches SIGINT and SIGTERM.
fn watch_stop() -> std::io::Result<(Signal, Signal)> {
    Ok((
        watch(SignalKind::interrupt())?,
        watch(SignalKind::terminate())?,
    ))
}

/// Resolves on the first SIGINT or SIGTERM (since [`install`], for the first caller).
pub async fn signal() {
    let taken = EARLY.lock().stop.take();
    let (mut int, mut term) = match taken {
        Some(s) => s,
        None => match watch_stop() {
            Ok(stop) => stop,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGINT and SIGTERM; only SIGINT stops the server");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        },
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// Runs `reload` on a blocking thread at every SIGHUP (since [`install`]), until the returned task is
/// aborted. `None` when SIGHUP cannot be watched (logged).
pub fn on_hangup<F>(reload: F) -> Option<tokio::task::JoinHandle<()>>
where
    F: Fn() + Send + Sync + 'static,
{
    let taken = EARLY.lock().hangup.take();
    let mut hup = match taken.map_or_else(|| watch(SignalKind::hangup()), Ok) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP; datasets are listed again only on the interval");
            return None;
        }
    };
    let reload = std::sync::Arc::new(reload);
    Some(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let r = reload.clone();
            let _ = tokio::task::spawn_blocking(move || r()).await;
        }
    }))
}
