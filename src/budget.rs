//! The in-flight memory budget: every request and stream reserves the bytes it will hold (decoded frames
//! waiting for assembly, output arrays, a stream's window of prepared batches) before it does the work,
//! so the daemon's memory stays within `--max-inflight-bytes` whatever a tenant asks, and one client's
//! within `--client-inflight-bytes`.
//!
//! Input: a number of bytes and who wants them ([`Who`]: what for, and the client ([`Peer`]) it is
//! charged to). Output: a [`Reservation`] that returns its bytes when dropped, or
//! [`Error::Overloaded`] (RESOURCE_EXHAUSTED) saying what was asked, what is in use and which limit
//! refused it: `GetClips needs 12582912750 bytes (11.7 GiB), 0 of 2147483648 in use (max-inflight-bytes)`.
//!
//! How the budget is shared ([`Shares`], the same rule admission applies to stream places):
//! - A client may hold at most `per_client` bytes (`--client-inflight-bytes`, default half the budget).
//! - The first `capacity - reserved` bytes go to any client within its quota. The last `reserved`
//!   bytes (`--reserved-inflight-bytes`, default an eighth) go only to a client that, with them, holds no
//!   more than its fair share: `(capacity - reserved) / k`, where k counts the clients holding bytes,
//!   the asker included. So heavy clients filling the budget leave room for a light one to start.
//! - Reservations of no client, and of in-process calls ([`PeerKey::Local`]), count only against the
//!   whole budget.
//!
//! Invariants:
//! - Bytes reserved ≤ capacity, always; a client's bytes ≤ its quota; a reservation is released exactly
//!   once (on drop, or in part by [`Reservation::shrink_to`]), from the total and from its client.
//! - A wait is bounded: [`Budget::try_reserve`] waits at most the budget's wait for others to release,
//!   then refuses. A request larger than the whole capacity, or than a client's quota, is refused at
//!   once (waiting cannot help).
//! - The budget counts what the handlers say they will hold; the frame cache, index cache and decode
//!   queue have their own bounds (`--cache-bytes`, `--decode-queue`) and are not counted here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::error::Error;
use crate::peer::{Peer, PeerKey};

/// How long a reservation waits for bytes others are about to release before it is refused.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(2);

/// How one pooled capacity (bytes, or stream places) is shared between clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shares {
    /// All clients together.
    pub capacity: u64,
    /// One client.
    pub per_client: u64,
    /// The last part of `capacity`, kept for clients below their fair share (less than `capacity`).
    pub reserved: u64,
}

/// Why [`Shares::check`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// The client would hold more than `per_client`.
    Client,
    /// All clients would hold more than `capacity`.
    Global,
    /// The ask reaches into the reserve and the client would then hold more than `fair`, its fair
    /// share with `holders` clients holding some (the asker included).
    Reserve { fair: u64, holders: u64 },
}

impl Shares {
    /// Everything for anyone: no per-client limit, no reserve.
    pub fn whole(capacity: u64) -> Shares {
        Shares {
            capacity,
            per_client: capacity,
            reserved: 0,
        }
    }

    /// Whether a client holding `mine` may take `want` more while all clients hold `used`, and
    /// `others` other clients hold some.
    pub fn check(&self, used: u64, mine: u64, others: u64, want: u64) -> Result<(), Over> {
        let total = used.checked_add(want).ok_or(Over::Global)?;
        if total > self.capacity {
            return Err(Over::Global);
        }
        let mine_after = mine.checked_add(want).ok_or(Over::Client)?;
        if mine_after > self.per_client {
            return Err(Over::Client);
        }
        let open = self.capacity.saturating_sub(self.reserved);
        if total > open {
            let holders = others + 1;
            let fair = (open / holders).max(1);
            if mine_after > fair {
                return Err(Over::Reserve { fair, holders });
            }
        }
        Ok(())
    }
}

/// Who a reservation is for: what it holds the bytes for (named in refusals) and the client it is
/// charged to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Who {
    pub what: String,
    pub client: Option<Peer>,
}

impl Who {
    pub fn new(what: impl Into<String>) -> Who {
        Who {
            what: what.into(),
            client: None,
        }
    }

    /// Charges the reservation to a client as well (its quota and fair share).
    pub fn client(mut self, peer: &Peer) -> Who {
        self.client = Some(peer.clone());
        self
    }

    /// The key per-client accounting uses: none for in-process calls.
    fn key(&self) -> Option<&PeerKey> {
        self.client
            .as_ref()
            .map(|p| &p.key)
            .filter(|k| **k != PeerKey::Local)
    }
}

impl From<&str> for Who {
    fn from(what: &str) -> Who {
        Who::new(what)
    }
}

impl From<String> for Who {
    fn from(what: String) -> Who {
        Who::new(what)
    }
}

/// The daemon's memory budget. Cheap to clone; clones share the count.
#[derive(Clone, Debug)]
pub struct Budget {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Used {
    total: u64,
    /// Bytes per client holding some (entries go at zero).
    clients: HashMap<PeerKey, u64>,
}

#[derive(Debug)]
struct Inner {
    shares: Shares,
    wait: Duration,
    used: Mutex<Used>,
    /// Woken whenever bytes are returned.
    freed: Notify,
    refusals: AtomicU64,
    /// Asked once by a client's reservation that does not fit for want of others' bytes
    /// ([`Budget::set_relief`]).
    relief: std::sync::OnceLock<Relief>,
}

/// Frees bytes for a client others' replies keep waiting: true when it ended one (the server's
/// admission takes back the place of a reply left unread, `crate::admission`).
pub struct Relief(pub Box<dyn Fn(&Peer) -> bool + Send + Sync>);

impl std::fmt::Debug for Relief {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Relief")
    }
}

/// Bytes held against the budget; returned when dropped.
#[derive(Debug)]
pub struct Reservation {
    inner: Arc<Inner>,
    bytes: u64,
    who: Who,
}

impl Budget {
    /// A budget of `capacity` bytes, all of it open to every client, whose reservations wait at most
    /// `wait` for bytes to be freed.
    pub fn new(capacity: u64, wait: Duration) -> Budget {
        Budget::shared(Shares::whole(capacity), wait)
    }

    /// A budget shared between clients as `shares` says.
    pub fn shared(shares: Shares, wait: Duration) -> Budget {
        let shares = Shares {
            per_client: shares.per_client.clamp(1, shares.capacity.max(1)),
            reserved: shares.reserved.min(shares.capacity.saturating_sub(1)),
            ..shares
        };
        Budget {
            inner: Arc::new(Inner {
                shares,
                wait,
                used: Mutex::new(Used::default()),
                freed: Notify::new(),
                refusals: AtomicU64::new(0),
                relief: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Sets what a client's reservation that does not fit asks, once, to free bytes others hold
    /// ([`Relief`]); the first setting stays.
    pub fn set_relief(&self, relief: Relief) {
        let _ = self.inner.relief.set(relief);
    }

    pub fn capacity(&self) -> u64 {
        self.inner.shares.capacity
    }

    pub fn shares(&self) -> Shares {
        self.inner.shares
    }

    /// Bytes reserved now.
    pub fn in_use(&self) -> u64 {
        self.inner.used.lock().total
    }

    /// Bytes reserved now by one client.
    pub fn client_in_use(&self, key: &PeerKey) -> u64 {
        self.inner
            .used
            .lock()
            .clients
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Reservations refused since start-up.
    pub fn refusals(&self) -> u64 {
        self.inner.refusals.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` for `who`, waiting (at most the budget's wait) for others to release some;
    /// RESOURCE_EXHAUSTED with the numbers when they do not fit.
    pub async fn try_reserve(&self, bytes: u64, who: impl Into<Who>) -> Result<Reservation, Error> {
        let who = who.into();
        self.inner.take(bytes, &who).await?;
        Ok(Reservation {
            inner: self.inner.clone(),
            bytes,
            who,
        })
    }

    /// Reserves `bytes` now or refuses: never waits.
    pub fn try_reserve_now(&self, bytes: u64, who: impl Into<Who>) -> Result<Reservation, Error> {
        let who = who.into();
        if let Err(over) = self.inner.take_now(bytes, &who) {
            return Err(self.inner.refuse(bytes, &who, over));
        }
        Ok(Reservation {
            inner: self.inner.clone(),
            bytes,
            who,
        })
    }
}

impl Inner {
    fn take_now(&self, bytes: u64, who: &Who) -> Result<(), Over> {
        let mut used = self.used.lock();
        match who.key() {
            None => {
                Shares::whole(self.shares.capacity).check(used.total, 0, 0, bytes)?;
                used.total += bytes;
            }
            Some(key) => {
                let mine = used.clients.get(key).copied().unwrap_or(0);
                let others = used.clients.len() as u64 - u64::from(mine > 0);
                self.shares.check(used.total, mine, others, bytes)?;
                used.total += bytes;
                if bytes > 0 {
                    *used.clients.entry(key.clone()).or_insert(0) += bytes;
                }
            }
        }
        Ok(())
    }

    async fn take(&self, bytes: u64, who: &Who) -> Result<(), Error> {
        if bytes > self.shares.capacity {
            return Err(self.refuse(bytes, who, Over::Global));
        }
        if who.key().is_some() && bytes > self.shares.per_client {
            return Err(self.refuse(bytes, who, Over::Client));
        }
        let open = self.shares.capacity.saturating_sub(self.shares.reserved);
        if who.key().is_some() && bytes > open {
            // Past the open part a client may hold only its fair share of it, never more than all of
            // it: no release can ever let this in, so it is refused now instead of after the wait.
            return Err(self.refuse(
                bytes,
                who,
                Over::Reserve {
                    fair: open,
                    holders: 1,
                },
            ));
        }
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut relieved = false;
        loop {
            // Registered before the check, so a release between the check and the wait is not missed.
            let freed = self.freed.notified();
            let over = match self.take_now(bytes, who) {
                Ok(()) => return Ok(()),
                Err(over) => over,
            };
            // Short for others' bytes (not its own quota): ask once for a reply nobody reads to end.
            if !relieved && matches!(over, Over::Global | Over::Reserve { .. }) {
                relieved = true;
                if let (Some(relief), Some(peer)) =
                    (self.relief.get(), who.key().and(who.client.as_ref()))
                {
                    (relief.0)(peer);
                }
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                // One last look: bytes freed just at the deadline still count.
                return self
                    .take_now(bytes, who)
                    .map_err(|over| self.refuse(bytes, who, over));
            }
        }
    }

    fn give_back(&self, bytes: u64, who: &Who) {
        if bytes == 0 {
            return;
        }
        {
            let mut used = self.used.lock();
            used.total = used.total.saturating_sub(bytes);
            if let Some(key) = who.key() {
                if let Some(mine) = used.clients.get_mut(key) {
                    *mine = mine.saturating_sub(bytes);
                    if *mine == 0 {
                        used.clients.remove(key);
                    }
                }
            }
        }
        self.freed.notify_waiters();
    }

    fn refuse(&self, bytes: u64, who: &Who, over: Over) -> Error {
        self.refusals.fetch_add(1, Ordering::Relaxed);
        let (used, mine) = {
            let u = self.used.lock();
            let mine = who
                .key()
                .and_then(|k| u.clients.get(k))
                .copied()
                .unwrap_or(0);
            (u.total, mine)
        };
        let s = &self.shares;
        // In-process calls are not charged to a client: not named either.
        let client = match (who.key(), &who.client) {
            (Some(_), Some(p)) => format!(" for {}", p.describe()),
            _ => String::new(),
        };
        let asked = format!(
            "{}{client} needs {bytes} bytes ({})",
            who.what,
            human_bytes(bytes)
        );
        Error::Overloaded(match over {
            Over::Global => {
                let whole = if bytes > s.capacity {
                    ", more than the whole budget"
                } else {
                    ""
                };
                format!(
                    "{asked}{whole}, {used} of {} in use (max-inflight-bytes)",
                    s.capacity
                )
            }
            Over::Client => {
                let whole = if bytes > s.per_client {
                    ", more than a client's whole quota"
                } else {
                    ""
                };
                format!(
                    "{asked}{whole}, {mine} of {} in use by this client (client-inflight-bytes)",
                    s.per_client
                )
            }
            // As the other limits say when an ask exceeds the whole of what they allow: past the open
            // part no client can go, whatever others release.
            Over::Reserve { .. } if bytes > s.capacity.saturating_sub(s.reserved) => format!(
                "{asked}, more than a client can ever hold: {} of the {} are kept for clients below their fair \
                 share of the other {} (reserved-inflight-bytes)",
                s.reserved,
                s.capacity,
                s.capacity.saturating_sub(s.reserved)
            ),
            Over::Reserve { fair, holders } => format!(
                "{asked}, {used} of {} in use; the last {} are kept for clients below their fair share \
                 ({fair} bytes with {holders} clients holding memory) and this one holds {mine} \
                 (reserved-inflight-bytes)",
                s.capacity, s.reserved
            ),
        })
    }
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn who(&self) -> &Who {
        &self.who
    }

    /// Returns all but `bytes` to the budget (nothing when it holds no more than that).
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.inner.give_back(self.bytes - bytes, &self.who);
            self.bytes = bytes;
        }
    }

    /// Takes `other`'s bytes into this reservation (both were reserved on the same budget, for the
    /// same client).
    pub fn absorb(&mut self, mut other: Reservation) {
        if Arc::ptr_eq(&self.inner, &other.inner) && self.who.key() == other.who.key() {
            self.bytes += other.bytes;
            other.bytes = 0;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.inner.give_back(self.bytes, &self.who);
    }
}

pub use crate::config::human_bytes;

pub mod sent;
pub use sent::Keep;

#[cfg(test)]
mod tests;
