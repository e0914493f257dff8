//! Admission control for streaming calls: at most `--max-streams` GetClips/StreamBatches calls at once;
//! one more is refused at once with [`Error::Overloaded`] (RESOURCE_EXHAUSTED) instead of queueing.
//!
//! Input: a call asking to start. Output: a [`StreamPermit`] held for the call's whole life (until its
//! reply stream ends or the client goes away), or the refusal. Invariant: permits out ≤ the limit.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::Error;

/// Counts concurrent streams against a limit. Cheap to clone; clones share the count.
#[derive(Clone, Debug)]
pub struct Admission {
    permits: Arc<Semaphore>,
    limit: usize,
}

/// One admitted stream; dropping it frees the slot.
#[derive(Debug)]
pub struct StreamPermit {
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    pub fn new(limit: usize) -> Admission {
        Admission {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// Admits one stream now, or refuses it: never waits.
    pub fn try_admit(&self) -> Result<StreamPermit, Error> {
        self.permits
            .clone()
            .try_acquire_owned()
            .map(|p| StreamPermit { _permit: p })
            .map_err(|_| {
                Error::Overloaded(format!(
                    "{} streams in flight, the limit (max-streams); retry later",
                    self.limit
                ))
            })
    }

    /// Streams admitted now.
    pub fn in_use(&self) -> usize {
        self.limit - self.permits.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_beyond_the_limit_and_frees_on_drop() {
        let a = Admission::new(2);
        let p1 = a.try_admit().unwrap();
        let _p2 = a.try_admit().unwrap();
        let e = a.try_admit().unwrap_err();
        assert!(matches!(e, Error::Overloaded(_)), "{e:?}");
        assert_eq!(a.in_use(), 2);
        drop(p1);
        assert_eq!(a.in_use(), 1);
        a.try_admit().unwrap();
    }
}
