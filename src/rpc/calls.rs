//! Calls in flight, of every method: bounded per client, per user and in all.
//!
//! Admission bounds the calls that do work (`crate::admission`); GetStats, ReleaseSlots, Quarantine and
//! health checks are never refused there, and a reply waits for its client's flow-control window
//! until its connection is closed for it (twice `--stream-idle-timeout`). One process opening 60
//! connections with no window and 256 GetStats on each held 15,360 calls and 110 MB of the daemon's
//! memory (7 KB a call) in a second; a user's processes together may hold a quarter of the daemon's
//! connections, so one user could take gigabytes. Every call now counts from its start until its reply
//! ends: at most [`CLIENT_CALLS`] of one client (a process on the Unix socket, an address on TCP),
//! [`USER_CALLS`] of one local user's processes, and [`TOTAL_CALLS`] in all; past one, the call is
//! refused at once, RESOURCE_EXHAUSTED naming the bound. A data-loading client holds far fewer
//! (`--client-streams` 32 and `--client-unary` 16 of the calls that work, the rest quick).
//!
//! Clients and users are hashed into [`BUCKETS`] counters each: two sharing a counter share its bound,
//! and the table never grows.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use crate::peer::{Peer, PeerKey};

/// Calls one client may have in flight.
pub const CLIENT_CALLS: u64 = 1024;
/// Calls one local user's processes may have in flight together.
pub const USER_CALLS: u64 = 4096;
/// Calls all clients may have in flight together (about 115 MB of calls left unread).
pub const TOTAL_CALLS: u64 = 16384;
/// Counters clients (and users) are hashed into.
pub const BUCKETS: usize = 1024;

/// The counts: per bucket of clients, per bucket of users, in all.
pub struct Ledger {
    clients: Vec<AtomicU64>,
    users: Vec<AtomicU64>,
    total: AtomicU64,
    caps: [u64; 3],
}

/// One call counted; dropping it ends the count.
pub struct Ticket {
    ledger: &'static Ledger,
    client: usize,
    user: Option<usize>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.ledger.clients[self.client].fetch_sub(1, Ordering::Relaxed);
        if let Some(u) = self.user {
            self.ledger.users[u].fetch_sub(1, Ordering::Relaxed);
        }
        self.ledger.total.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The counter `key` is hashed into, of [`BUCKETS`] (request bodies' ledger uses it too).
pub(super) fn bucket(key: impl Hash) -> usize {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % BUCKETS as u64) as usize
}

impl Ledger {
    pub fn new(client: u64, user: u64, total: u64) -> Ledger {
        let counters = || (0..BUCKETS).map(|_| AtomicU64::new(0)).collect();
        Ledger {
            clients: counters(),
            users: counters(),
            total: AtomicU64::new(0),
            caps: [client, user, total],
        }
    }

    /// The daemon's ledger.
    pub fn global() -> &'static Ledger {
        static LEDGER: LazyLock<Ledger> =
            LazyLock::new(|| Ledger::new(CLIENT_CALLS, USER_CALLS, TOTAL_CALLS));
        &LEDGER
    }

    /// Counts a call of `peer`, or says which bound it would cross (counting nothing). In-process calls
    /// count only in all.
    pub fn enter(&'static self, peer: &Peer) -> Result<Ticket, String> {
        let local = peer.key == PeerKey::Local;
        let client = bucket(&peer.key);
        let user = peer
            .user()
            .filter(|_| matches!(peer.key, PeerKey::Process { .. } | PeerKey::User(_)))
            .map(bucket);
        let [client_cap, user_cap, total_cap] = self.caps;
        let ticket = Ticket {
            ledger: self,
            client,
            user,
        };
        // Counted first, then checked: the ticket's drop gives back whatever a refusal counted.
        let n_client = self.clients[client].fetch_add(1, Ordering::Relaxed) + 1;
        let n_user = user.map(|u| self.users[u].fetch_add(1, Ordering::Relaxed) + 1);
        let n_total = self.total.fetch_add(1, Ordering::Relaxed) + 1;
        if !local && n_client > client_cap {
            Err(format!(
                "{} has {client_cap} calls in flight, the most one client may (calls whose replies are \
                 not read count until their connection closes)",
                peer.describe()
            ))
        } else if !local && n_user.is_some_and(|n| n > user_cap) {
            Err(format!(
                "uid {}'s processes have {user_cap} calls in flight, the most one user's may",
                peer.user().unwrap_or_default()
            ))
        } else if n_total > total_cap {
            Err(format!(
                "{total_cap} calls in flight, the most the daemon takes from all clients"
            ))
        } else {
            Ok(ticket)
        }
    }

    /// Calls counted in all.
    #[cfg(test)]
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: i32, uid: u32) -> Peer {
        Peer {
            key: PeerKey::Process { pid, start: 1 },
            uid: Some(uid),
            tcp_uid: None,
        }
    }

    /// Each bound refuses the call that would cross it, counting nothing; a ticket's drop frees its
    /// place in every count.
    #[test]
    fn calls_are_bounded_per_client_per_user_and_in_all() {
        let ledger: &'static Ledger = Box::leak(Box::new(Ledger::new(2, 3, 5)));
        let a = process(10, 1000);
        let held: Vec<Ticket> = (0..2).map(|_| ledger.enter(&a).unwrap()).collect();
        let e = ledger.enter(&a).err().expect("a third call of one client");
        assert!(
            e.contains("pid 10") && e.contains("2 calls in flight"),
            "{e}"
        );
        // Another process of the same user: one more, then the user's bound.
        let b = process(11, 1000);
        let b1 = ledger.enter(&b).unwrap();
        let e = ledger.enter(&b).err().expect("a fourth call of one user");
        assert!(e.contains("uid 1000's processes have 3"), "{e}");
        // Another user: two more, then the bound in all.
        let c = process(20, 2000);
        let _c: Vec<Ticket> = (0..2).map(|_| ledger.enter(&c).unwrap()).collect();
        let e = ledger
            .enter(&process(30, 3000))
            .err()
            .expect("a sixth call");
        assert!(e.contains("5 calls in flight"), "{e}");
        assert_eq!(ledger.total(), 5, "refusals count nothing");
        drop(b1);
        drop(held);
        let _again = ledger.enter(&a).unwrap();
        assert_eq!(ledger.total(), 3);
    }
}
