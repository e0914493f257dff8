//! Admission: who may start a call now. Streaming calls (GetClips, StreamBatches) are admitted against
//! `--max-streams` and, per client, `--client-streams`; unary calls that do work (Probe, ListDatasets)
//! against `--max-unary` and `--client-unary`. A call beyond a limit is refused at once with
//! [`Error::Overloaded`] (RESOURCE_EXHAUSTED, naming the limit and the client) instead of queueing, so
//! one client holding all it may leaves room for the others.
//!
//! Input: a call asking to start, and its [`Peer`]. Output: a [`Permit`] held for the call's whole life
//! (until its reply ends or the client goes away), or the refusal. Invariants: permits out ≤ the global
//! limit; permits of one client ≤ its limit; a client's entry goes when its last permit does.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::Error;
use crate::peer::{Peer, PeerKey};

/// Which limits a call counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// A reply stream carrying arrays.
    Stream,
    /// A unary call that does work (file walks, index scans).
    Unary,
}

impl Class {
    fn flags(self) -> (&'static str, &'static str) {
        match self {
            Class::Stream => ("max-streams", "client-streams"),
            Class::Unary => ("max-unary", "client-unary"),
        }
    }
}

/// Limits of one class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassLimits {
    pub total: usize,
    pub per_client: usize,
}

#[derive(Debug)]
struct Pool {
    permits: Arc<Semaphore>,
    limits: ClassLimits,
}

/// The admission state of the server. Cheap to clone; clones share the counts.
#[derive(Clone, Debug)]
pub struct Admission {
    streams: Arc<Pool>,
    unary: Arc<Pool>,
    /// Permits held per (client, class).
    held: Arc<Mutex<HashMap<(PeerKey, Class), usize>>>,
}

/// One admitted call; dropping it frees its place.
#[derive(Debug)]
pub struct Permit {
    _global: OwnedSemaphorePermit,
    key: (PeerKey, Class),
    held: Arc<Mutex<HashMap<(PeerKey, Class), usize>>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

impl Admission {
    pub fn new(streams: ClassLimits, unary: ClassLimits) -> Admission {
        let pool = |l: ClassLimits| {
            Arc::new(Pool {
                permits: Arc::new(Semaphore::new(l.total)),
                limits: l,
            })
        };
        Admission {
            streams: pool(streams),
            unary: pool(unary),
            held: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Only the global stream limit (every client may take all of it): for tests and embedders.
    pub fn streams_only(limit: usize) -> Admission {
        let all = ClassLimits {
            total: limit,
            per_client: limit,
        };
        Admission::new(all, all)
    }

    fn pool(&self, class: Class) -> &Pool {
        match class {
            Class::Stream => &self.streams,
            Class::Unary => &self.unary,
        }
    }

    /// Admits one call of `class` from `peer` now, or refuses it: never waits.
    pub fn try_admit(&self, class: Class, peer: &Peer) -> Result<Permit, Error> {
        let pool = self.pool(class);
        let (global_flag, client_flag) = class.flags();
        let what = match class {
            Class::Stream => "streams",
            Class::Unary => "calls",
        };
        let key = (peer.key.clone(), class);
        let global = pool.permits.clone().try_acquire_owned().map_err(|_| {
            Error::Overloaded(format!(
                "{} {what} in flight, the limit ({global_flag}); retry later",
                pool.limits.total
            ))
        })?;
        let mut held = self.held.lock();
        let mine = held.get(&key).copied().unwrap_or(0);
        if mine >= pool.limits.per_client {
            return Err(Error::Overloaded(format!(
                "{} has {mine} {what} in flight, the limit per client ({client_flag}); retry when one ends",
                peer.describe()
            )));
        }
        *held.entry(key.clone()).or_insert(0) += 1;
        Ok(Permit {
            _global: global,
            key,
            held: self.held.clone(),
        })
    }

    /// Calls of `class` admitted now.
    pub fn in_use(&self, class: Class) -> usize {
        let pool = self.pool(class);
        pool.limits.total - pool.permits.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(p: i32) -> Peer {
        Peer {
            key: PeerKey::Process { pid: p, start: 1 },
            uid: Some(1000),
        }
    }

    #[test]
    fn refuses_beyond_the_limit_and_frees_on_drop() {
        let a = Admission::streams_only(2);
        let me = Peer::local();
        let p1 = a.try_admit(Class::Stream, &me).unwrap();
        let _p2 = a.try_admit(Class::Stream, &me).unwrap();
        let e = a.try_admit(Class::Stream, &me).unwrap_err();
        assert!(
            matches!(&e, Error::Overloaded(m) if m.contains("max-streams")),
            "{e:?}"
        );
        assert_eq!(a.in_use(Class::Stream), 2);
        drop(p1);
        assert_eq!(a.in_use(Class::Stream), 1);
        a.try_admit(Class::Stream, &me).unwrap();
    }

    #[test]
    fn one_client_at_its_limit_leaves_room_for_another() {
        let a = Admission::new(
            ClassLimits {
                total: 4,
                per_client: 2,
            },
            ClassLimits {
                total: 1,
                per_client: 1,
            },
        );
        let (hog, other) = (pid(10), pid(11));
        let h1 = a.try_admit(Class::Stream, &hog).unwrap();
        let _h2 = a.try_admit(Class::Stream, &hog).unwrap();
        let e = a.try_admit(Class::Stream, &hog).unwrap_err();
        assert!(
            matches!(&e, Error::Overloaded(m) if m.contains("client-streams") && m.contains("pid 10")),
            "{e:?}"
        );
        // The refusal took nothing: the other client gets the two places left.
        let _o1 = a.try_admit(Class::Stream, &other).unwrap();
        let _o2 = a.try_admit(Class::Stream, &other).unwrap();
        let e = a.try_admit(Class::Stream, &pid(12)).unwrap_err();
        assert!(
            matches!(&e, Error::Overloaded(m) if m.contains("max-streams")),
            "{e:?}"
        );
        // Classes count apart.
        let u = a.try_admit(Class::Unary, &hog).unwrap();
        assert!(a.try_admit(Class::Unary, &other).is_err());
        drop(u);
        drop(h1);
        a.try_admit(Class::Stream, &hog).unwrap();
        a.try_admit(Class::Unary, &other).unwrap();
        assert_eq!(a.held.lock().len(), 2, "entries go with their last permit");
    }
}
