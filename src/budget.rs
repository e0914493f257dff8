//! The in-flight memory budget: every request and stream reserves the bytes it will hold (decoded frames
//! waiting for assembly, output arrays, a stream's window of prepared batches) before it does the work,
//! so the daemon's memory stays within `--max-inflight-bytes` whatever a tenant asks.
//!
//! Input: a number of bytes and who wants them ([`Who`]: what for, and later the client key a
//! per-client quota will charge). Output: a [`Reservation`] that returns its bytes when dropped, or
//! [`Error::Overloaded`] (RESOURCE_EXHAUSTED) saying what was asked and what is in use:
//! `GetClips needs 12582912750 bytes (11.7 GiB), 0 of 2147483648 in use (max-inflight-bytes)`.
//!
//! Invariants:
//! - Bytes reserved ≤ capacity, always; a reservation is released exactly once (on drop, or in part
//!   by [`Reservation::shrink_to`]).
//! - A wait is bounded: [`Budget::try_reserve`] waits at most the budget's wait for others to release,
//!   then refuses. A request larger than the whole capacity is refused at once (waiting cannot help).
//! - The budget counts what the handlers say they will hold; the frame cache, index cache and decode
//!   queue have their own bounds (`--cache-bytes`, `--decode-queue`) and are not counted here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::error::Error;

/// How long a reservation waits for bytes others are about to release before it is refused.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(2);

/// Who a reservation is for: what it holds the bytes for (named in refusals) and, once per-client
/// quotas exist, the client it is charged to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Who {
    pub what: String,
    pub client: Option<Arc<str>>,
}

impl Who {
    pub fn new(what: impl Into<String>) -> Who {
        Who {
            what: what.into(),
            client: None,
        }
    }

    /// Charges the reservation to a client key as well (kept with the reservation; the per-client
    /// accounting lives in admission).
    pub fn client(mut self, key: impl Into<Arc<str>>) -> Who {
        self.client = Some(key.into());
        self
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

#[derive(Debug)]
struct Inner {
    capacity: u64,
    wait: Duration,
    used: Mutex<u64>,
    /// Woken whenever bytes are returned.
    freed: Notify,
    refusals: AtomicU64,
}

/// Bytes held against the budget; returned when dropped.
#[derive(Debug)]
pub struct Reservation {
    inner: Arc<Inner>,
    bytes: u64,
    who: Who,
}

impl Budget {
    /// A budget of `capacity` bytes whose reservations wait at most `wait` for bytes to be freed.
    pub fn new(capacity: u64, wait: Duration) -> Budget {
        Budget {
            inner: Arc::new(Inner {
                capacity,
                wait,
                used: Mutex::new(0),
                freed: Notify::new(),
                refusals: AtomicU64::new(0),
            }),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// Bytes reserved now.
    pub fn in_use(&self) -> u64 {
        *self.inner.used.lock()
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
        if !self.inner.take_now(bytes) {
            return Err(self.inner.refuse(bytes, &who));
        }
        Ok(Reservation {
            inner: self.inner.clone(),
            bytes,
            who,
        })
    }
}

impl Inner {
    fn take_now(&self, bytes: u64) -> bool {
        let mut used = self.used.lock();
        match used.checked_add(bytes) {
            Some(total) if total <= self.capacity => {
                *used = total;
                true
            }
            _ => false,
        }
    }

    async fn take(&self, bytes: u64, who: &Who) -> Result<(), Error> {
        if bytes > self.capacity {
            return Err(self.refuse(bytes, who));
        }
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            // Registered before the check, so a release between the check and the wait is not missed.
            let freed = self.freed.notified();
            if self.take_now(bytes) {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                // One last look: bytes freed just at the deadline still count.
                if self.take_now(bytes) {
                    return Ok(());
                }
                return Err(self.refuse(bytes, who));
            }
        }
    }

    fn give_back(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        {
            let mut used = self.used.lock();
            *used = used.saturating_sub(bytes);
        }
        self.freed.notify_waiters();
    }

    fn refuse(&self, bytes: u64, who: &Who) -> Error {
        self.refusals.fetch_add(1, Ordering::Relaxed);
        let used = *self.used.lock();
        let whole = if bytes > self.capacity {
            ", more than the whole budget"
        } else {
            ""
        };
        Error::Overloaded(format!(
            "{} needs {bytes} bytes ({}){whole}, {used} of {} in use (max-inflight-bytes)",
            who.what,
            human_bytes(bytes),
            self.capacity,
        ))
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
            self.inner.give_back(self.bytes - bytes);
            self.bytes = bytes;
        }
    }

    /// Takes `other`'s bytes into this reservation (both were reserved on the same budget).
    pub fn absorb(&mut self, mut other: Reservation) {
        if Arc::ptr_eq(&self.inner, &other.inner) {
            self.bytes += other.bytes;
            other.bytes = 0;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.inner.give_back(self.bytes);
    }
}

/// A byte count for people: `11.7 GiB`, `512.0 KiB`, `750 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reserves_within_capacity_and_returns_on_drop() {
        let b = Budget::new(100, Duration::from_millis(10));
        let r1 = b.try_reserve(60, "a").await.unwrap();
        let mut r2 = b.try_reserve(40, "b").await.unwrap();
        assert_eq!(b.in_use(), 100);
        let e = b.try_reserve(1, "GetClips").await.unwrap_err();
        match e {
            Error::Overloaded(m) => assert_eq!(
                m,
                "GetClips needs 1 bytes (1 B), 100 of 100 in use (max-inflight-bytes)"
            ),
            other => panic!("{other:?}"),
        }
        r2.shrink_to(10);
        assert_eq!(b.in_use(), 70);
        drop(r1);
        assert_eq!(b.in_use(), 10);
        drop(r2);
        assert_eq!(b.in_use(), 0);
        assert_eq!(b.refusals(), 1);
    }

    #[tokio::test]
    async fn more_than_the_whole_budget_is_refused_without_waiting() {
        let b = Budget::new(1 << 30, Duration::from_secs(60));
        let t = std::time::Instant::now();
        let e = b.try_reserve(12_582_912_000, "GetClips").await.unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(
            e.to_string(),
            "GetClips needs 12582912000 bytes (11.7 GiB), more than the whole budget, 0 of 1073741824 in use (max-inflight-bytes)"
        );
        assert_eq!(e.code(), crate::error::Code::ResourceExhausted);
        // Sums that overflow are refused too, never wrapped.
        let _r = b.try_reserve_now(1, "x").unwrap();
        assert!(b.try_reserve_now(u64::MAX, "y").is_err());
        assert_eq!(b.in_use(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_reservation_gets_bytes_released_within_its_wait() {
        let b = Budget::new(100, Duration::from_secs(10));
        let held = b.try_reserve(80, "first").await.unwrap();
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.try_reserve(50, "second").await.map(|r| r.bytes()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiter.is_finished(),
            "50 more bytes do not fit while 80 are held"
        );
        drop(held);
        assert_eq!(waiter.await.unwrap().unwrap(), 50);
        assert_eq!(b.in_use(), 0);

        // Nothing released within the wait: refused after it, not before.
        let b = Budget::new(100, Duration::from_millis(200));
        let _held = b.try_reserve(80, "first").await.unwrap();
        let t = std::time::Instant::now();
        assert!(b.try_reserve(50, "second").await.is_err());
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(190) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn absorbed_and_client_charged_reservations_keep_the_count() {
        let b = Budget::new(100, Duration::ZERO);
        let mut window = b
            .try_reserve(30, Who::new("stream").client("uid:1000"))
            .await
            .unwrap();
        assert_eq!(window.who().client.as_deref(), Some("uid:1000"));
        let extra = b.try_reserve_now(20, "stream growth").unwrap();
        window.absorb(extra);
        assert_eq!((window.bytes(), b.in_use()), (50, 50));
        let other = Budget::new(10, Duration::ZERO);
        let foreign = other.try_reserve_now(5, "x").unwrap();
        window.absorb(foreign);
        assert_eq!((window.bytes(), b.in_use(), other.in_use()), (50, 50, 0));
        drop(window);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(750), "750 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(13_194_139_533_312), "12.0 TiB");
    }
}
