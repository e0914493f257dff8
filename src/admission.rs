//! Admission: who may start a call now. Streaming calls (GetClips, StreamBatches, and CheckDataset,
//! which decodes a whole dataset for minutes) are admitted against `--max-streams` and, per client,
//! `--client-streams`; unary calls that do work (Probe, ListDatasets) against `--max-unary` and
//! `--client-unary`. A call beyond a limit is refused at once with [`Error::Overloaded`]
//! (RESOURCE_EXHAUSTED, naming the limit and the client) instead of queueing.
//!
//! Fairness when the global limit fills (the policy, as [`Shares::check`] applies it):
//! - A client holds at most its per-client limit.
//! - The first `total - reserved` places go to anyone within that limit. The last `reserved` places
//!   (`--reserved-streams`, default an eighth of `--max-streams`) go only to a client that, with the new
//!   place, holds no more than its fair share: `(total - reserved) / k` (at least one), where k counts
//!   the clients holding places of the class, the asker included.
//! - So heavy clients can fill the open part but not the reserve: a client holding no stream gets one
//!   beside them while the reserve has a place, and light clients (a control rank, a GetClips probe)
//!   are not starved by ranks that hold many streams. The in-flight byte budget applies the same rule
//!   ([`crate::budget`], `--reserved-inflight-bytes`). Unary calls have no reserve (they are short).
//!
//! Input: a call asking to start, and its [`Peer`]. Output: a [`Permit`] held for the call's whole life
//! (until its reply ends or the client goes away), or the refusal. Invariants: permits out ≤ the global
//! limit; permits of one client ≤ its limit; places past `total - reserved` are held only by clients
//! that were within their fair share when they took them; a client's entry goes when its last permit
//! does.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::budget::{Over, Shares};
use crate::error::Error;
use crate::peer::{Peer, PeerKey};

/// Which limits a call counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// A long call: a reply stream carrying arrays, or a dataset check.
    Stream,
    /// A unary call that does work (file walks, index scans).
    Unary,
}

impl Class {
    fn flags(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Class::Stream => ("max-streams", "client-streams", "reserved-streams"),
            Class::Unary => ("max-unary", "client-unary", "reserved-unary"),
        }
    }
}

/// Limits of one class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassLimits {
    pub total: usize,
    pub per_client: usize,
    /// The last places of `total`, for clients below their fair share.
    pub reserved: usize,
}

impl ClassLimits {
    fn shares(self) -> Shares {
        Shares {
            capacity: self.total as u64,
            per_client: self.per_client as u64,
            reserved: self.reserved.min(self.total.saturating_sub(1)) as u64,
        }
    }
}

/// Places held of one class: in all, and per client.
#[derive(Debug, Default)]
struct Held {
    total: usize,
    clients: HashMap<PeerKey, usize>,
}

#[derive(Debug)]
struct Pool {
    limits: ClassLimits,
    held: Mutex<Held>,
}

/// The admission state of the server. Cheap to clone; clones share the counts.
#[derive(Clone, Debug)]
pub struct Admission {
    streams: Arc<Pool>,
    unary: Arc<Pool>,
}

/// One admitted call; dropping it frees its place.
#[derive(Debug)]
pub struct Permit {
    pool: Arc<Pool>,
    key: PeerKey,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self.pool.held.lock();
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.clients.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.clients.remove(&self.key);
            }
        }
    }
}

impl Admission {
    pub fn new(streams: ClassLimits, unary: ClassLimits) -> Admission {
        let pool = |limits: ClassLimits| {
            Arc::new(Pool {
                limits,
                held: Mutex::new(Held::default()),
            })
        };
        Admission {
            streams: pool(streams),
            unary: pool(unary),
        }
    }

    /// Only the global stream limit (every client may take all of it, nothing reserved): for tests and
    /// embedders.
    pub fn streams_only(limit: usize) -> Admission {
        let all = ClassLimits {
            total: limit,
            per_client: limit,
            reserved: 0,
        };
        Admission::new(all, all)
    }

    fn pool(&self, class: Class) -> &Arc<Pool> {
        match class {
            Class::Stream => &self.streams,
            Class::Unary => &self.unary,
        }
    }

    /// Admits one call of `class` from `peer` now, or refuses it: never waits.
    pub fn try_admit(&self, class: Class, peer: &Peer) -> Result<Permit, Error> {
        let pool = self.pool(class);
        let (global_flag, client_flag, reserve_flag) = class.flags();
        let what = match class {
            Class::Stream => "streams",
            Class::Unary => "calls",
        };
        let limits = pool.limits;
        let mut held = pool.held.lock();
        let mine = held.clients.get(&peer.key).copied().unwrap_or(0);
        let others = held.clients.len() - usize::from(mine > 0);
        let verdict = limits
            .shares()
            .check(held.total as u64, mine as u64, others as u64, 1);
        match verdict {
            Ok(()) => {}
            Err(Over::Client) => {
                return Err(Error::Overloaded(format!(
                    "{} has {mine} {what} in flight, the limit per client ({client_flag}); retry when one ends",
                    peer.describe()
                )))
            }
            Err(Over::Global) => {
                return Err(Error::Overloaded(format!(
                    "{} {what} in flight, the limit ({global_flag}); retry later",
                    limits.total
                )))
            }
            Err(Over::Reserve { fair, holders }) => {
                return Err(Error::Overloaded(format!(
                    "{} {what} in flight of {} ({global_flag}); the last {} are kept for clients below their fair share \
                     ({fair} with {holders} clients holding {what}) and {} has {mine} ({reserve_flag}); retry later",
                    held.total,
                    limits.total,
                    limits.shares().reserved,
                    peer.describe()
                )))
            }
        }
        held.total += 1;
        *held.clients.entry(peer.key.clone()).or_insert(0) += 1;
        Ok(Permit {
            pool: pool.clone(),
            key: peer.key.clone(),
        })
    }

    /// Calls of `class` admitted now.
    pub fn in_use(&self, class: Class) -> usize {
        self.pool(class).held.lock().total
    }

    /// Clients holding calls of `class` now.
    pub fn clients(&self, class: Class) -> usize {
        self.pool(class).held.lock().clients.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(p: i32) -> Peer {
        Peer {
            key: PeerKey::Process { pid: p, start: 1 },
            uid: Some(1000),
            tcp_uid: None,
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
                reserved: 0,
            },
            ClassLimits {
                total: 1,
                per_client: 1,
                reserved: 0,
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
        assert_eq!(
            (a.clients(Class::Stream), a.clients(Class::Unary)),
            (2, 0),
            "entries go with their last permit"
        );
    }

    #[test]
    fn heavy_clients_leave_the_reserve_to_light_ones() {
        let limits = ClassLimits {
            total: 8,
            per_client: 8,
            reserved: 2,
        };
        let a = Admission::new(limits, limits);
        let (hog, light, third) = (pid(10), pid(11), pid(12));
        // The hog, alone and allowed 8, gets the 6 open places and not the reserve.
        let hogs: Vec<Permit> = (0..6)
            .map(|_| a.try_admit(Class::Stream, &hog).unwrap())
            .collect();
        let e = a.try_admit(Class::Stream, &hog).unwrap_err();
        assert_eq!(
            e.to_string(),
            "6 streams in flight of 8 (max-streams); the last 2 are kept for clients below their fair share \
             (6 with 1 clients holding streams) and pid 10 (uid 1000) has 6 (reserved-streams); retry later"
        );
        // A client holding none gets a reserved place, and a second (its share beside the hog is 3).
        let l1 = a.try_admit(Class::Stream, &light).unwrap();
        let _l2 = a.try_admit(Class::Stream, &light).unwrap();
        let e = a.try_admit(Class::Stream, &third).unwrap_err();
        assert!(e.to_string().contains("(max-streams)"), "{e}");
        drop(l1);
        // The freed place is in the reserve: the hog may not take it back, a newcomer may.
        assert!(a.try_admit(Class::Stream, &hog).is_err());
        let _t = a.try_admit(Class::Stream, &third).unwrap();
        assert_eq!(a.in_use(Class::Stream), 8);
        drop(hogs);
        assert_eq!((a.in_use(Class::Stream), a.clients(Class::Stream)), (2, 2));
    }
}
