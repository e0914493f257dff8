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
//! Places taken back (both classes, when the server sets it up with [`Admission::taking_back`]): a place
//! stands for work, but a reply waiting for a client that opens no flow-control window holds its place
//! until its connection is closed for it (twice `--stream-idle-timeout`, `server::conns`); four clients
//! holding every stream place that way refused every other client for 20-25 minutes (probe C, D2), at no
//! cost to themselves and each within its fair share, and unread Probe replies did the same to the unary
//! places. So a call refused for its class's global limit or reserve takes a place back from a call
//! - whose reply's bytes have waited that long with none written (`after`: `--stream-idle-timeout`, at
//!   most 30 s; [`Sent::waiting_for`]), and
//! - whose tenant holds more places than the asker's: tenants are users (a Unix socket's uid, a
//!   loopback TCP socket's owner) or remote addresses; between two processes of one user (64 hung
//!   workers of one trainer, say), the processes' places are compared.
//!
//! The in-flight byte budget asks the same ([`Admission::relieve`]) once for a reservation that does not
//! fit for want of others' bytes: the asker's own call, which holds no bytes yet, is not counted against
//! it, and the taken reply's bytes come back when its connection closes.
//!
//! Such a call of the tenant holding most, the longest waiting, loses its place and its connection is
//! closed (what the connection's watchdog does later anyway), with a log line naming the limit and
//! `vserve_places_taken_back`. So places move only from a larger holder to a smaller one, and
//! only from replies nobody reads: a reply being read, a call still working, and a tenant no larger
//! than the asker are never taken; nor is anything while a place is free.
//!
//! Input: a call asking to start, and its [`Peer`]. Output: a [`Permit`] held for the call's whole life
//! (until its reply ends or the client goes away), or the refusal. Invariants: permits out ≤ the global
//! limit; permits of one client ≤ its limit; places past `total - reserved` are held only by clients
//! that were within their fair share when they took them; a client's entry goes when its last permit
//! does.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;

use crate::budget::sent::Sent;
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

/// Whose places are weighed against whose when one is taken back: a local user (a Unix socket's uid, or
/// the owner of a loopback TCP socket), a remote address, or in-process calls.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Tenant {
    User(u32),
    Address(IpAddr),
    Local,
}

impl Tenant {
    fn of(peer: &Peer) -> Tenant {
        match (peer.user(), &peer.key) {
            (Some(uid), _) => Tenant::User(uid),
            (None, PeerKey::User(uid)) => Tenant::User(*uid),
            (None, PeerKey::Address(ip)) => Tenant::Address(*ip),
            (None, _) => Tenant::Local,
        }
    }
}

/// One admitted call.
struct Entry {
    peer: Peer,
    tenant: Tenant,
    /// Its reply's bytes, once the RPC layer has them: what a take-back weighs and ends.
    reply: Option<Weak<Sent>>,
}

/// Places held of one class: in all, per client and per tenant, and by call.
#[derive(Default)]
struct Held {
    total: usize,
    clients: HashMap<PeerKey, usize>,
    tenants: HashMap<Tenant, usize>,
    calls: HashMap<u64, Entry>,
    next: u64,
}

/// Places `key` holds in `map`.
fn of<K: std::hash::Hash + Eq>(map: &HashMap<K, usize>, key: &K) -> usize {
    map.get(key).copied().unwrap_or(0)
}

/// One place more (`up`) or less for `key` in `map`; a key holding none leaves it.
fn count<K: std::hash::Hash + Eq + Clone>(map: &mut HashMap<K, usize>, key: &K, up: bool) {
    if up {
        *map.entry(key.clone()).or_insert(0) += 1;
    } else if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Held {
    fn insert(&mut self, id: u64, entry: Entry) {
        self.total += 1;
        count(&mut self.clients, &entry.peer.key, true);
        count(&mut self.tenants, &entry.tenant, true);
        self.calls.insert(id, entry);
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.calls.remove(&id)?;
        self.total -= 1;
        count(&mut self.clients, &entry.peer.key, false);
        count(&mut self.tenants, &entry.tenant, false);
        Some(entry)
    }

    /// The call whose place `asker` (of `tenant`) may take back (module comment): of the calls whose
    /// reply has waited at least `after` and whose holder holds more places than the asker's (its tenant
    /// against the asker's; within the asker's tenant, its client against the asker), one of the
    /// largest holder, the longest waiting.
    /// `(mine, ours)`: the places the asker and its tenant count as holding.
    fn victim(
        &self,
        asker: &PeerKey,
        tenant: &Tenant,
        (mine, ours): (usize, usize),
        after: Duration,
    ) -> Option<(u64, Duration)> {
        let now = Instant::now();
        let mut best: Option<(u64, usize, Duration)> = None;
        for (&id, e) in &self.calls {
            if e.peer.key == *asker {
                continue;
            }
            let holds = if e.tenant != *tenant {
                of(&self.tenants, &e.tenant).checked_sub(ours)
            } else {
                of(&self.clients, &e.peer.key).checked_sub(mine)
            };
            let Some(lead) = holds.filter(|&n| n > 0) else {
                continue;
            };
            let Some(waited) = e
                .reply
                .as_ref()
                .and_then(Weak::upgrade)
                .and_then(|r| r.waiting_for(now))
            else {
                continue;
            };
            if waited >= after && best.is_none_or(|(_, l, w)| (lead, waited) > (l, w)) {
                best = Some((id, lead, waited));
            }
        }
        best.map(|(id, _, waited)| (id, waited))
    }
}

/// When a refused call may take a place back ([`Admission::taking_back`]).
#[derive(Clone, Debug)]
struct TakeBack {
    after: Duration,
    counted: Counter,
}

impl TakeBack {
    /// Ends the call whose place was taken for `asker`, refused for `limit`: its connection is closed,
    /// counted and logged.
    fn ended(&self, entry: Entry, waited: Duration, asker: &Peer, limit: &str) {
        self.counted.inc();
        let closed = entry
            .reply
            .and_then(|r| r.upgrade())
            .is_some_and(|r| r.close_connection());
        tracing::warn!(
            client = %entry.peer.describe(),
            for_client = %asker.describe(),
            %limit,
            waited_seconds = waited.as_secs_f64(),
            connection_closed = closed,
            "place taken back: the client's reply waited that long for its flow-control window with no \
             byte written while another client was refused (the limit named); its connection is closed"
        );
    }
}

struct Pool {
    class: Class,
    limits: ClassLimits,
    held: Mutex<Held>,
    take_back: Option<TakeBack>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("limits", &self.limits)
            .finish()
    }
}

impl Pool {
    /// Whether `peer` may take one more place now ([`Shares::check`]).
    fn check(&self, held: &Held, peer: &Peer) -> Result<(), Over> {
        let mine = of(&held.clients, &peer.key);
        let others = held.clients.len() - usize::from(mine > 0);
        self.limits
            .shares()
            .check(held.total as u64, mine as u64, others as u64, 1)
    }

    /// The refusal for `over`, naming the limit and the client.
    fn refusal(&self, over: Over, held: &Held, peer: &Peer) -> Error {
        let (global_flag, client_flag, reserve_flag) = self.class.flags();
        let what = match self.class {
            Class::Stream => "streams",
            Class::Unary => "calls",
        };
        let mine = of(&held.clients, &peer.key);
        Error::Overloaded(match over {
            Over::Client => format!(
                "{} has {mine} {what} in flight, the limit per client ({client_flag}); retry when one ends",
                peer.describe()
            ),
            Over::Global => format!(
                "{} {what} in flight, the limit ({global_flag}); retry later",
                self.limits.total
            ),
            Over::Reserve { fair, holders } => format!(
                "{} {what} in flight of {} ({global_flag}); the last {} are kept for clients below their fair share \
                 ({fair} with {holders} clients holding {what}) and {} has {mine} ({reserve_flag}); retry later",
                held.total,
                self.limits.total,
                self.limits.shares().reserved,
                peer.describe()
            ),
        })
    }
}

/// The admission state of the server. Cheap to clone; clones share the counts.
#[derive(Clone, Debug)]
pub struct Admission {
    streams: Arc<Pool>,
    unary: Arc<Pool>,
}

/// One admitted call; dropping it frees its place (unless it was taken back).
#[derive(Debug)]
pub struct Permit {
    pool: Arc<Pool>,
    id: u64,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.pool.held.lock().remove(self.id);
    }
}

impl Admission {
    pub fn new(streams: ClassLimits, unary: ClassLimits) -> Admission {
        let pool = |class, limits| {
            Arc::new(Pool {
                class,
                limits,
                held: Mutex::new(Held::default()),
                take_back: None,
            })
        };
        Admission {
            streams: pool(Class::Stream, streams),
            unary: pool(Class::Unary, unary),
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

    /// Lets a call refused a place take one back from a reply that has waited `after` for its client
    /// (module comment; never with None), counting each in `counted`. Call before the admission is
    /// cloned.
    pub fn taking_back(mut self, after: Option<Duration>, counted: Counter) -> Admission {
        let take_back = after.map(|after| TakeBack { after, counted });
        for pool in [&mut self.streams, &mut self.unary] {
            Arc::get_mut(pool)
                .expect("set before the admission is shared")
                .take_back = take_back.clone();
        }
        self
    }

    fn pool(&self, class: Class) -> &Arc<Pool> {
        match class {
            Class::Stream => &self.streams,
            Class::Unary => &self.unary,
        }
    }

    /// Admits one call of `class` from `peer` now, or refuses it: never waits. `reply`: the call's reply
    /// bytes, for taking its place back (stream calls).
    pub fn try_admit(
        &self,
        class: Class,
        peer: &Peer,
        reply: Option<&Arc<Sent>>,
    ) -> Result<Permit, Error> {
        let pool = self.pool(class);
        let tenant = Tenant::of(peer);
        let mut held = pool.held.lock();
        let mut verdict = pool.check(&held, peer);
        let mut taken = None;
        if let (Err(Over::Global | Over::Reserve { .. }), Some(tb)) = (verdict, &pool.take_back) {
            let counts = (of(&held.clients, &peer.key), of(&held.tenants, &tenant));
            if let Some((id, waited)) = held.victim(&peer.key, &tenant, counts, tb.after) {
                let entry = held.remove(id).expect("a victim is held");
                verdict = pool.check(&held, peer);
                if verdict.is_ok() {
                    taken = Some((entry, waited));
                } else {
                    held.insert(id, entry);
                }
            }
        }
        if let Err(over) = verdict {
            return Err(pool.refusal(over, &held, peer));
        }
        let id = held.next;
        held.next += 1;
        held.insert(
            id,
            Entry {
                peer: peer.clone(),
                tenant,
                reply: reply.map(Arc::downgrade),
            },
        );
        drop(held);
        if let (Some((entry, waited)), Some(tb)) = (taken, &pool.take_back) {
            tb.ended(entry, waited, peer, pool.class.flags().0);
        }
        Ok(Permit {
            pool: pool.clone(),
            id,
        })
    }

    /// For the in-flight byte budget: `peer`, refused bytes, takes back the stream place of a reply left
    /// unread (module comment), whose bytes its connection's close gives back. Its own call, which
    /// holds no bytes yet, is not counted against it (so a client holding one place may take the
    /// place of another holding one). Whether one was taken.
    pub fn relieve(&self, peer: &Peer) -> bool {
        let pool = &self.streams;
        let Some(tb) = &pool.take_back else {
            return false;
        };
        let tenant = Tenant::of(peer);
        let mut held = pool.held.lock();
        let counts = (
            of(&held.clients, &peer.key).saturating_sub(1),
            of(&held.tenants, &tenant).saturating_sub(1),
        );
        let Some((id, waited)) = held.victim(&peer.key, &tenant, counts, tb.after) else {
            return false;
        };
        let entry = held.remove(id).expect("a victim is held");
        drop(held);
        tb.ended(entry, waited, peer, "max-inflight-bytes");
        true
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
        let p1 = a.try_admit(Class::Stream, &me, None).unwrap();
        let _p2 = a.try_admit(Class::Stream, &me, None).unwrap();
        let e = a.try_admit(Class::Stream, &me, None).unwrap_err();
        assert!(
            matches!(&e, Error::Overloaded(m) if m.contains("max-streams")),
            "{e:?}"
        );
        assert_eq!(a.in_use(Class::Stream), 2);
        drop(p1);
        assert_eq!(a.in_use(Class::Stream), 1);
        a.try_admit(Class::Stream, &me, None).unwrap();
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
        let h1 = a.try_admit(Class::Stream, &hog, None).unwrap();
        let _h2 = a.try_admit(Class::Stream, &hog, None).unwrap();
        let e = a.try_admit(Class::Stream, &hog, None).unwrap_err();
        assert!(
            matches!(&e, Error::Overloaded(m) if m.contains("client-streams") && m.contains("pid 10")),
            "{e:?}"
        );
        // The refusal took nothing: the other client gets the two places left.
        let _o1 = a.try_admit(Class::Stream, &other, None).unwrap();
        let _o2 = a.try_admit(Class::Stream, &other, None).unwrap();
        let e = a.try_admit(Class::Stream, &pid(12), None).unwrap_err();
        assert!(
            matches!(&e, Error::Overloaded(m) if m.contains("max-streams")),
            "{e:?}"
        );
        // Classes count apart.
        let u = a.try_admit(Class::Unary, &hog, None).unwrap();
        assert!(a.try_admit(Class::Unary, &other, None).is_err());
        drop(u);
        drop(h1);
        a.try_admit(Class::Stream, &hog, None).unwrap();
        a.try_admit(Class::Unary, &other, None).unwrap();
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
            .map(|_| a.try_admit(Class::Stream, &hog, None).unwrap())
            .collect();
        let e = a.try_admit(Class::Stream, &hog, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "6 streams in flight of 8 (max-streams); the last 2 are kept for clients below their fair share \
             (6 with 1 clients holding streams) and pid 10 (uid 1000) has 6 (reserved-streams); retry later"
        );
        // A client holding none gets a reserved place, and a second (its share beside the hog is 3).
        let l1 = a.try_admit(Class::Stream, &light, None).unwrap();
        let _l2 = a.try_admit(Class::Stream, &light, None).unwrap();
        let e = a.try_admit(Class::Stream, &third, None).unwrap_err();
        assert!(e.to_string().contains("(max-streams)"), "{e}");
        drop(l1);
        // The freed place is in the reserve: the hog may not take it back, a newcomer may.
        assert!(a.try_admit(Class::Stream, &hog, None).is_err());
        let _t = a.try_admit(Class::Stream, &third, None).unwrap();
        assert_eq!(a.in_use(Class::Stream), 8);
        drop(hogs);
        assert_eq!((a.in_use(Class::Stream), a.clients(Class::Stream)), (2, 2));
    }

    fn user(pid: i32, uid: u32) -> Peer {
        Peer {
            key: PeerKey::Process { pid, start: 1 },
            uid: Some(uid),
            tcp_uid: None,
        }
    }

    /// `total` places of each class, all open to any client, taken back after `after`, counted in
    /// `counted`.
    fn taking(total: usize, after: Duration, counted: &Counter) -> Admission {
        let limits = ClassLimits {
            total,
            per_client: total,
            reserved: 0,
        };
        Admission::new(limits, limits).taking_back(Some(after), counted.clone())
    }

    /// A reply on a connection of its own; `waiting`: one of its pieces is held unwritten.
    fn reply(waiting: bool) -> (Arc<Sent>, Arc<crate::peer::Link>, Option<bytes::Bytes>) {
        let link = crate::peer::Link::new();
        let sent = Sent::on(Some(link.clone()));
        let piece = waiting.then(|| sent.wrap(bytes::Bytes::from_static(b"frame")));
        (sent, link, piece)
    }

    /// Probe C's D2, the rule: a refused client takes a place back only from a reply waiting for its
    /// client, only from a tenant holding more places than its own, the largest first.
    #[test]
    fn a_refused_client_takes_back_the_place_of_a_larger_tenants_waiting_reply() {
        let counted = Counter::default();
        let a = taking(4, Duration::ZERO, &counted);
        let (hog, other) = (user(10, 1000), user(20, 2000));
        let replies: Vec<_> = [true, false, true, true].map(reply).into();
        let mut permits: Vec<Permit> = replies[..3]
            .iter()
            .map(|(s, _, _)| a.try_admit(Class::Stream, &hog, Some(s)).unwrap())
            .collect();
        permits.push(
            a.try_admit(Class::Stream, &other, Some(&replies[3].0))
                .unwrap(),
        );
        let closed = || {
            replies
                .iter()
                .map(|(_, l, _)| l.is_closed())
                .collect::<Vec<_>>()
        };

        // User 3000 holds none: user 1000, holding most, loses its longest waiting reply (user 2000's
        // waits too).
        let newcomer = |pid| user(pid, 3000);
        let n1 = a.try_admit(Class::Stream, &newcomer(30), None).unwrap();
        assert_eq!(closed(), [true, false, false, false]);
        assert_eq!((a.in_use(Class::Stream), counted.get()), (4, 1));
        // User 3000 holds one, user 1000 two: its other waiting reply goes; the one not waiting never.
        let _n2 = a.try_admit(Class::Stream, &newcomer(31), None).unwrap();
        assert_eq!(closed(), [true, false, true, false]);
        // User 3000 holds two, no other tenant more: refused.
        let e = a.try_admit(Class::Stream, &newcomer(32), None).unwrap_err();
        assert!(e.to_string().contains("(max-streams)"), "{e}");
        assert_eq!(
            (closed(), counted.get()),
            (vec![true, false, true, false], 2)
        );
        // A taken permit frees nothing when dropped; the others do.
        drop(permits.remove(0));
        assert_eq!(a.in_use(Class::Stream), 4);
        drop(n1);
        assert_eq!(a.in_use(Class::Stream), 3);
        a.try_admit(Class::Stream, &newcomer(32), None).unwrap();
    }

    /// Within one user, processes are weighed: a process holding none takes the place of a process's
    /// reply nobody reads (a hung worker), not of one being read.
    #[test]
    fn within_one_user_a_process_holding_none_takes_a_hung_ones_place() {
        let a = taking(2, Duration::ZERO, &Counter::default());
        let replies = [reply(false), reply(true)];
        let _held: Vec<Permit> = [10, 11]
            .into_iter()
            .zip(&replies)
            .map(|(pid, (s, _, _))| {
                a.try_admit(Class::Stream, &user(pid, 1000), Some(s))
                    .unwrap()
            })
            .collect();
        let _p = a.try_admit(Class::Stream, &user(12, 1000), None).unwrap();
        assert_eq!(
            replies.each_ref().map(|(_, l, _)| l.is_closed()),
            [false, true]
        );
        let e = a
            .try_admit(Class::Stream, &user(13, 1000), None)
            .unwrap_err();
        assert!(e.to_string().contains("(max-streams)"), "{e}");
    }

    /// For the in-flight byte budget: a client whose call is short of bytes takes the place of another's
    /// unread reply as large as that call, never one of its own.
    #[test]
    fn a_client_short_of_bytes_takes_back_another_clients_unread_reply() {
        let a = taking(8, Duration::ZERO, &Counter::default());
        let (asker, other) = (user(10, 1000), user(11, 1000));
        let (own, theirs) = (reply(true), reply(true));
        let _mine = a.try_admit(Class::Stream, &asker, Some(&own.0)).unwrap();
        let _theirs = a.try_admit(Class::Stream, &other, Some(&theirs.0)).unwrap();
        assert!(a.relieve(&asker));
        assert!(theirs.1.is_closed() && !own.1.is_closed());
        assert!(!a.relieve(&asker), "only its own unread reply is left");
        assert!(!own.1.is_closed());
    }

    /// Before its reply has waited `after`, no place is taken back, and with places free none is.
    #[test]
    fn nothing_is_taken_back_before_the_wait_or_while_a_place_is_free() {
        let a = taking(3, Duration::from_secs(3600), &Counter::default());
        let hog = user(10, 1000);
        let replies = [reply(true), reply(true)];
        let _held: Vec<Permit> = replies
            .iter()
            .map(|(s, _, _)| a.try_admit(Class::Stream, &hog, Some(s)).unwrap())
            .collect();
        let _n = a.try_admit(Class::Stream, &user(30, 3000), None).unwrap();
        let e = a
            .try_admit(Class::Stream, &user(31, 4000), None)
            .unwrap_err();
        assert!(e.to_string().contains("(max-streams)"), "{e}");
        assert!(replies.iter().all(|(_, l, _)| !l.is_closed()));
    }
}
