//! What a GetClips call hands the transport: its reply messages, which a client that stops reading
//! cannot hold forever, and status messages that fit a gRPC header.
//!
//! A GetClips reply is complete before its first message goes out, and holds its bytes and its
//! in-flight budget until the transport has taken the last message. The transport takes a message only
//! when the client's HTTP/2 window has room, so a client that stops reading (a frozen process, a
//! client with a one-byte window) used to hold both until its connection closed, and other tenants got
//! RESOURCE_EXHAUSTED meanwhile. [`Reply`] gives them up after `--stream-idle-timeout` without a message
//! taken (the StreamBatches rule): the bytes not yet taken and the reservation are dropped at once, with
//! a log line, and the call ends DEADLINE_EXCEEDED if its client ever reads on.
//!
//! A message taken is not yet sent: the transport holds the last one or two taken until the client's
//! window lets them out. So the reservation is not dropped when the last message is taken but handed to
//! the RPC layer's [`Keep`], which holds it until those bytes are written ([`crate::budget::sent`]); a
//! watchdog giving the reply up keeps the part that covers the messages the transport may still hold.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio_stream::Stream;
use tonic::Status;

use super::pb;
use crate::budget::Keep;
use crate::budget::Reservation;
use crate::engine::CallGuard;
use crate::peer::Peer;

type Message = Result<pb::GetClipsResponse, Status>;

/// A GetClips reply being sent (see the module comment).
pub struct Reply {
    held: Arc<Mutex<Held>>,
    /// The watchdog, stopped with the reply (or it would sleep out its timeout, one task per call).
    watchdog: Option<tokio::task::AbortHandle>,
    /// The call's count in progress: the transport drops the reply once its end is sent, which the RPC
    /// layer holds back until every byte before it is written.
    _inflight: Option<CallGuard>,
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(w) = &self.watchdog {
            w.abort();
        }
    }
}

struct Held {
    messages: VecDeque<Message>,
    reservation: Option<Reservation>,
    /// Messages taken so far: the watchdog's measure of progress.
    taken: u64,
    /// Given up for want of a reader: the next poll ends the call.
    expired: Option<Duration>,
    /// Bytes of the last two messages taken: what the transport may still hold.
    recent: [u64; 2],
    /// Where the reservation goes when the reply is done with it (dropped without one).
    keep: Option<Keep>,
}

impl Held {
    /// Hands the reservation, cut to `bytes`, to the RPC layer (or drops it).
    fn release(&mut self, bytes: u64) {
        let Some(mut r) = self.reservation.take() else {
            return;
        };
        if let Some(keep) = &self.keep {
            if bytes > 0 {
                r.shrink_to(bytes.min(r.bytes()));
                keep.hold(r);
            }
        }
    }
}

impl Reply {
    /// The reply `messages`, holding `reservation` until the last is taken and then handing it to `keep`
    /// (until the bytes are written); given up after `idle` without one taken (never with a zero
    /// `idle`). Spawns its watchdog: call within the runtime.
    pub fn new(
        messages: Vec<Message>,
        reservation: Option<Reservation>,
        keep: Option<Keep>,
        idle: Duration,
        peer: &Peer,
    ) -> Reply {
        let held = Arc::new(Mutex::new(Held {
            messages: messages.into(),
            reservation,
            taken: 0,
            expired: None,
            recent: [0; 2],
            keep,
        }));
        let watchdog = (!idle.is_zero()).then(|| {
            tokio::spawn(watch(Arc::downgrade(&held), idle, peer.describe())).abort_handle()
        });
        Reply {
            held,
            watchdog,
            _inflight: None,
        }
    }

    /// The reply, counting its call in progress with `inflight` until it is dropped.
    pub fn counted(mut self, inflight: CallGuard) -> Reply {
        self._inflight = Some(inflight);
        self
    }
}

/// Gives the reply up once `idle` passes with no message taken and some left.
async fn watch(held: Weak<Mutex<Held>>, idle: Duration, client: String) {
    let mut seen = 0;
    loop {
        tokio::time::sleep(idle).await;
        let Some(held) = held.upgrade() else { return };
        let mut h = held.lock();
        if h.messages.is_empty() && h.reservation.is_none() {
            return;
        }
        if h.taken == seen {
            let bytes: usize = h
                .messages
                .iter()
                .filter_map(|m| m.as_ref().ok())
                .map(|m| m.data.len())
                .sum();
            h.messages.clear();
            let in_transport = h.recent.iter().sum();
            h.release(in_transport);
            h.expired = Some(idle);
            tracing::warn!(
                %client,
                seconds = idle.as_secs_f64(),
                dropped_bytes = bytes,
                in_transport_bytes = in_transport,
                "GetClips reply not read: messages not yet handed to the transport dropped and their budget released; what the transport holds stays reserved until written, reset or the connection closes (--stream-idle-timeout)"
            );
            return;
        }
        seen = h.taken;
    }
}

impl Stream for Reply {
    type Item = Message;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Message>> {
        let mut h = self.held.lock();
        if let Some(idle) = h.expired.take() {
            return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                "the reply was not read for {} s (--stream-idle-timeout); its bytes were released",
                idle.as_secs_f64()
            )))));
        }
        let next = h.messages.pop_front();
        h.taken += 1;
        match &next {
            Some(m) => {
                let bytes = m.as_ref().map_or(0, |m| m.data.len() as u64 + 64);
                h.recent = [h.recent[1], bytes];
            }
            // The transport asks past the last message as soon as it has taken the last (not sent it):
            // the reservation lasts as long as the bytes (module comment).
            None => {
                let whole = h.reservation.as_ref().map_or(0, Reservation::bytes);
                h.release(whole);
            }
        }
        Poll::Ready(next)
    }
}

/// Most bytes of a status message once percent-encoded for its `grpc-message` header: gRPC clients
/// refuse a reply whose headers pass 8-16 KiB (RESOURCE_EXHAUSTED "metadata size exceeds hard limit"),
/// which an error echoing a 10,000-character path would, hiding the real status.
const STATUS_MESSAGE_BYTES: usize = 4096;

/// `msg`, cut (at a character boundary, marked) to [`STATUS_MESSAGE_BYTES`] once percent-encoded
/// (printable ASCII but `%` is one byte, everything else three).
pub fn bounded_message(msg: String) -> String {
    let encoded = |c: char| {
        if c.is_ascii_graphic() && c != '%' || c == ' ' {
            1
        } else {
            3 * c.len_utf8()
        }
    };
    let mut used = 0;
    for (i, c) in msg.char_indices() {
        used += encoded(c);
        if used > STATUS_MESSAGE_BYTES - 64 {
            return format!("{} [... {} more bytes cut]", &msg[..i], msg.len() - i);
        }
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply's watchdog ends with the reply, not an idle timeout later: a daemon serving thousands
    /// of GetClips a minute keeps no sleeping task per call.
    #[tokio::test]
    async fn the_watchdog_ends_with_its_reply() {
        let reply = Reply::new(
            Vec::new(),
            None,
            None,
            Duration::from_secs(3600),
            &Peer::local(),
        );
        let watchdog = reply.watchdog.clone().expect("a watchdog");
        assert!(!watchdog.is_finished());
        drop(reply);
        for _ in 0..100 {
            if watchdog.is_finished() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the watchdog outlived its reply");
    }
}
