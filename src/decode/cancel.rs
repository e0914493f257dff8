//! Stopping a decode run from outside its thread. The fleet gives each run a flag for as long as the run
//! is on its thread ([`Scope`]); backends poll [`requested`] between packets (a relaxed atomic load) and
//! stop with [`DecodeError::Cancelled`](super::DecodeError::Cancelled). The watchdog raises the flag at
//! the run's deadline and when every requester has gone away, so a long run nobody waits for neither
//! keeps a core busy to its natural end nor has its thread abandoned and replaced. A read blocked in the
//! kernel never polls: the watchdog abandons that thread once the flag has gone unanswered for a while.
//!
//! Pausing: a run may also be given the end of its time slice. Past it, [`yield_due`] is true, and a
//! backend that can continue a run where it stopped (FFmpeg's keeps its decoder where it stands) returns
//! at the next frame boundary with the frames it has and [`RunOutput::yielded`](super::RunOutput::yielded)
//! set; the fleet then lets another client's run have the thread, and asks for the rest after it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The run on this thread: its stop flag, the end of its time slice (None: it runs to its end), and
/// whether this is the run's first slice.
struct Current {
    flag: Arc<AtomicBool>,
    slice_end: Option<Instant>,
    first: bool,
}

thread_local! {
    static CURRENT: RefCell<Option<Current>> = const { RefCell::new(None) };
}

/// The flag (and time slice) of the run on this thread until dropped.
pub struct Scope(());

impl Scope {
    pub fn enter(flag: Arc<AtomicBool>) -> Scope {
        Scope::slice(flag, None, true)
    }

    /// A run that should return at the first frame boundary past `slice_end`, when given; `first`: the
    /// run's first slice (not a continuation of one that returned early).
    pub fn slice(flag: Arc<AtomicBool>, slice_end: Option<Instant>, first: bool) -> Scope {
        CURRENT.with(|c| {
            *c.borrow_mut() = Some(Current {
                flag,
                slice_end,
                first,
            })
        });
        Scope(())
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = None);
    }
}

/// Whether the run on this thread is in its first slice (true outside a run). A backend continuing a
/// run that had to seek back instead (the frames it stopped at did not lead to the next one wanted) stops
/// early again only after it gave a wanted frame: so a run whose continuations keep seeking back still
/// ends.
pub fn first_slice() -> bool {
    CURRENT.with(|c| c.borrow().as_ref().is_none_or(|c| c.first))
}

/// True when the run on this thread is past the end of its time slice (false outside a run, and for a
/// run without one).
pub fn yield_due() -> bool {
    CURRENT.with(|c| {
        c.borrow()
            .as_ref()
            .and_then(|c| c.slice_end)
            .is_some_and(|end| Instant::now() >= end)
    })
}

/// True when the run on this thread has been asked to stop (false outside a run).
pub fn requested() -> bool {
    CURRENT.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|c| c.flag.load(Ordering::Relaxed))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_flag_is_seen_inside_its_scope_only_and_on_its_thread_only() {
        let flag = Arc::new(AtomicBool::new(false));
        assert!(!requested());
        {
            let _scope = Scope::enter(flag.clone());
            assert!(!requested());
            flag.store(true, Ordering::Relaxed);
            assert!(requested());
            let other = std::thread::spawn(requested).join().unwrap();
            assert!(!other, "another thread has no run");
        }
        assert!(!requested(), "the scope ended");
    }

    #[test]
    fn a_slice_is_due_only_past_its_end_and_only_inside_its_scope() {
        let flag = Arc::new(AtomicBool::new(false));
        {
            let _scope = Scope::enter(flag.clone());
            assert!(!yield_due(), "a run without a slice runs to its end");
        }
        {
            let _scope = Scope::slice(
                flag.clone(),
                Some(Instant::now() + Duration::from_secs(60)),
                false,
            );
            assert!(!yield_due());
            assert!(!first_slice());
        }
        {
            let _scope = Scope::slice(flag, Some(Instant::now()), true);
            assert!(first_slice());
            assert!(yield_due());
            assert!(!std::thread::spawn(yield_due).join().unwrap());
        }
        assert!(!yield_due(), "the scope ended");
    }
}
