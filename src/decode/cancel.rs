//! Stopping a decode run from outside its thread. The fleet gives each run a flag for as long as the run
//! is on its thread ([`Scope`]); backends poll [`requested`] between packets (a relaxed atomic load) and
//! stop with [`DecodeError::Cancelled`](super::DecodeError::Cancelled). The watchdog raises the flag at
//! the run's deadline and when every requester has gone away, so a long run nobody waits for neither
//! keeps a core busy to its natural end nor has its thread abandoned and replaced. A read blocked in the
//! kernel never polls: the watchdog abandons that thread once the flag has gone unanswered for a while.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

thread_local! {
    static CURRENT: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// The flag of the run on this thread until dropped.
pub struct Scope(());

impl Scope {
    pub fn enter(flag: Arc<AtomicBool>) -> Scope {
        CURRENT.with(|c| *c.borrow_mut() = Some(flag));
        Scope(())
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = None);
    }
}

/// True when the run on this thread has been asked to stop (false outside a run).
pub fn requested() -> bool {
    CURRENT.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
