//! A reply's bytes until the socket has them: what keeps a reply's budget honest after its handler is done.
//!
//! A reply message handed to the transport is not sent. hyper hands a whole data frame (a whole gRPC
//! message, up to 8 MiB) to h2's send buffer as soon as the stream's window has one byte of room, then
//! asks the reply for the next; so a reply of one message ended, and gave back its in-flight reservation
//! and its stream slot, while its bytes still sat in h2 waiting for a client that never read them. 400
//! unread 7.8 MB replies held 3.35 GB with `--max-inflight-bytes 256M` and every gauge at 0 (probe P,
//! F3), and nothing timed them out.
//!
//! So every data frame of a reply is wrapped ([`Sent::wrap`]) in a piece that counts itself out when h2
//! drops it, which it does once the frame's last byte is written to the socket. A reply's end (its
//! trailers) is held back until every piece is gone ([`Sent::poll_sent`]): the call, its stream slot
//! and whatever its handler parked in [`Keep`] (the reply's budget reservation) last as long as its
//! bytes. A reply that writes no whole piece for `--stream-idle-timeout` after its end is reset, which
//! makes h2 drop its pieces: the bytes, the reservation and the slot go together, with a log line. A
//! reply whose next piece waits in hyper for the client's flow-control window is not polled, so nothing
//! here runs for it: every reply is followed by its connection's [`Link`] too, and the connection's
//! watchdog closes a connection on which one reply's pieces make no progress for twice as long
//! (`server::conns`).

use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use super::Reservation;
use crate::peer::{Link, Reply};

/// The pieces of one reply still held by the transport, and what lasts as long as they do.
#[derive(Default)]
pub struct Sent {
    state: Mutex<State>,
    /// The connection the reply goes out on (none in-process).
    link: Option<Arc<Link>>,
}

#[derive(Default)]
struct State {
    /// Pieces handed out and not yet dropped.
    pieces: usize,
    /// Their bytes.
    bytes: u64,
    /// Pieces dropped so far: the idle timer's measure of progress.
    dropped: u64,
    /// Since when a piece has waited with none written: the first piece handed out, or the last written
    /// with others still held; None while none is held.
    waiting: Option<Instant>,
    /// The reply waiting for its pieces to go.
    waiter: Option<Waker>,
    /// Given up with the last piece (or with the reply, if that is later).
    kept: Vec<Reservation>,
}

impl Sent {
    pub fn new() -> Arc<Sent> {
        Arc::new(Sent::default())
    }

    /// For a reply going out on `link`'s connection: its pieces are counted there too.
    pub fn on(link: Option<Arc<Link>>) -> Arc<Sent> {
        let sent = Arc::new(Sent {
            state: Mutex::default(),
            link,
        });
        if let Some(l) = &sent.link {
            l.call_began(); // ended in Drop: the reply is counted as the connection's open call
            l.follow(Arc::downgrade(&sent) as Weak<dyn Reply>);
        }
        sent
    }

    /// `data`, counted until the transport drops it.
    pub fn wrap(self: &Arc<Self>, data: Bytes) -> Bytes {
        if data.is_empty() {
            return data;
        }
        let mut s = self.state.lock();
        if s.pieces == 0 {
            s.waiting = Some(Instant::now());
        }
        s.pieces += 1;
        s.bytes += data.len() as u64;
        drop(s);
        Bytes::from_owner(Piece {
            data,
            sent: self.clone(),
        })
    }

    /// Ready once every piece handed out is gone; otherwise wakes `cx` when the last goes.
    pub fn poll_sent(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.state.lock();
        if s.pieces == 0 {
            return Poll::Ready(());
        }
        match &mut s.waiter {
            Some(w) => w.clone_from(cx.waker()),
            None => s.waiter = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Pieces dropped so far (grows while the client reads).
    pub fn progress(&self) -> u64 {
        self.state.lock().dropped
    }

    /// Bytes handed out and not yet written.
    pub fn unsent(&self) -> u64 {
        self.state.lock().bytes
    }

    /// How long, at `now`, a piece has waited for the client with none written; None while none is
    /// held (a reply still being made, or all written).
    pub fn waiting_for(&self, now: Instant) -> Option<Duration> {
        let since = self.state.lock().waiting?;
        Some(now.saturating_duration_since(since))
    }

    /// Closes the connection the reply goes out on (its calls end and h2 drops their pieces); false
    /// for a reply with no connection (in-process).
    pub fn close_connection(&self) -> bool {
        self.link.as_ref().inspect(|l| l.close()).is_some()
    }

    /// A handle for the reply's handler.
    pub fn keep(self: &Arc<Self>) -> Keep {
        Keep(self.clone())
    }
}

impl Reply for Sent {
    fn pieces(&self) -> (usize, u64, u64) {
        let s = self.state.lock();
        (s.pieces, s.bytes, s.dropped)
    }
}

impl Drop for Sent {
    fn drop(&mut self) {
        if let Some(l) = &self.link {
            l.call_ended();
        }
    }
}

/// Lets a handler make a reservation last as long as its reply's bytes: found in the request's
/// extensions (the RPC layer puts it there).
#[derive(Clone)]
pub struct Keep(Arc<Sent>);

impl Keep {
    /// Holds `r` until the reply has ended and its last byte is written (or the reply is reset).
    pub fn hold(&self, r: Reservation) {
        self.0.state.lock().kept.push(r);
    }
}

/// One data frame of a reply, counted out when the transport drops it.
struct Piece {
    data: Bytes,
    sent: Arc<Sent>,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        let mut s = self.sent.state.lock();
        s.pieces -= 1;
        s.bytes -= self.data.len() as u64;
        s.dropped += 1;
        s.waiting = (s.pieces > 0).then(Instant::now);
        if s.pieces == 0 {
            if let Some(w) = s.waiter.take() {
                w.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budget;
    use std::time::Duration;

    /// A reservation kept by a reply is given back only when the reply and every piece it handed out
    /// are gone, and the reply's wait for its pieces ends with the last.
    #[test]
    fn kept_reservations_last_as_long_as_the_pieces() {
        let budget = Budget::new(1 << 20, Duration::ZERO);
        let sent = Sent::new();
        let big = 100_000;
        let a = sent.wrap(Bytes::from(vec![7u8; big]));
        let b = sent.wrap(Bytes::from(vec![9u8; 50]));
        assert_eq!(
            sent.wrap(Bytes::new()).len(),
            0,
            "empty frames are not counted"
        );
        assert_eq!((&a[..3], &b[48..]), (&[7u8; 3][..], &[9u8; 2][..]));
        sent.keep()
            .hold(budget.try_reserve_now(600, "reply").unwrap());
        assert_eq!(sent.unsent(), big as u64 + 50);

        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(sent.poll_sent(&mut cx).is_pending());
        let mut a = a;
        let tail = a.split_off(60);
        drop(a);
        assert_eq!(sent.progress(), 0, "a piece counts out with its last slice");
        assert!(sent.poll_sent(&mut cx).is_pending());
        drop(tail);
        assert_eq!((sent.progress(), sent.unsent()), (1, 50));
        assert!(sent.poll_sent(&mut cx).is_pending());
        drop(b);
        assert!(sent.poll_sent(&mut cx).is_ready());
        assert_eq!(budget.in_use(), 600, "the reply itself still holds it");
        drop(sent);
        assert_eq!(budget.in_use(), 0);

        // Pieces outliving the reply hold the reservation.
        let sent = Sent::new();
        let late = sent.wrap(Bytes::from(vec![1u8; 10]));
        sent.keep()
            .hold(budget.try_reserve_now(300, "reply").unwrap());
        drop(sent);
        assert_eq!(budget.in_use(), 300);
        drop(late);
        assert_eq!(budget.in_use(), 0);
    }
}
