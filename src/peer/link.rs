//! The connection a call came on: its replies' pieces the transport holds and has not yet written, and
//! a way to close it.
//!
//! hyper stops polling a reply while its next data frame waits for the client's flow-control window,
//! so nothing of the reply's own (its idle reset, `budget::sent`) runs: a client that opens no window
//! kept the reply's budget and stream slot until it closed the connection. So every reply registers
//! itself ([`Link::follow`]) on its connection's [`Link`], and the connection's watchdog
//! (`server::conns`) closes a connection on which any one reply's pieces make no progress for twice
//! `--stream-idle-timeout`, whatever its other replies do: a client reading its other calls kept a
//! stalled reply's bytes and budget for as long as it went on calling, when the measure was the
//! connection's pieces as a whole. [`OnLink`] carries the link in the connection information tonic
//! hands every request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};

/// A reply as its connection's watchdog sees it.
pub trait Reply: Send + Sync {
    /// Pieces the transport holds now, their bytes, and pieces written so far.
    fn pieces(&self) -> (usize, u64, u64);
}

/// One connection's replies, its open calls, and its close switch.
pub struct Link {
    /// Calls open on the connection: a call is open from its start until its reply has ended and the
    /// transport has dropped its last byte (`budget::sent::Sent`'s life).
    calls: AtomicU64,
    /// Calls begun so far.
    begun: AtomicU64,
    /// When the connection began, and when its last call ended (the connection's quiet time counts
    /// from there): milliseconds after `born`.
    born: tokio::time::Instant,
    quiet_from_ms: AtomicU64,
    /// The replies the watchdog follows.
    replies: Mutex<Followed>,
    /// Set to close the connection: its reads and writes fail from then on.
    closed: AtomicBool,
    /// The connection's reader, woken to see `closed`.
    reader: AtomicWaker,
    /// Told when the connection is gone (ends its watchdog).
    gone: Notify,
}

/// The replies registered on a connection (the ended ones are pruned at each watchdog tick, and when
/// the list has doubled since the last pruning).
#[derive(Default)]
struct Followed {
    replies: Vec<Watch>,
    prune_at: usize,
}

/// A reply, and what the watchdog saw of it at its last tick.
struct Watch {
    reply: Weak<dyn Reply>,
    written: u64,
    held: bool,
    /// Ticks in a row that found pieces held, held at the tick before, and none written since.
    stalled: u32,
}

/// Replies a connection may have registered before they are pruned, at the least.
const PRUNE_AT: usize = 64;

impl Link {
    pub fn new() -> Arc<Link> {
        Arc::new(Link {
            calls: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            born: tokio::time::Instant::now(),
            quiet_from_ms: AtomicU64::new(0),
            replies: Mutex::default(),
            closed: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            gone: Notify::new(),
        })
    }

    /// A call began on the connection.
    pub fn call_began(&self) {
        self.begun.fetch_add(1, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::AcqRel);
    }

    /// A call ended (its reply's last byte written or dropped).
    pub fn call_ended(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.quiet_from_ms.fetch_max(ms, Ordering::Relaxed);
        self.calls.fetch_sub(1, Ordering::AcqRel);
    }

    /// How long the connection has had no call open, and whether it ever had one; None while a call
    /// is open.
    pub fn quiet(&self) -> Option<(std::time::Duration, bool)> {
        if self.calls.load(Ordering::Acquire) > 0 {
            return None;
        }
        let from = std::time::Duration::from_millis(self.quiet_from_ms.load(Ordering::Relaxed));
        let had_calls = self.begun.load(Ordering::Relaxed) > 0;
        Some((self.born.elapsed().saturating_sub(from), had_calls))
    }

    /// Follows `reply` until it ends (its watchdog reads it at every tick).
    pub fn follow(&self, reply: Weak<dyn Reply>) {
        let mut f = self.replies.lock();
        if f.replies.len() >= f.prune_at.max(PRUNE_AT) {
            f.replies.retain(|w| w.reply.strong_count() > 0);
            f.prune_at = 2 * f.replies.len();
        }
        f.replies.push(Watch {
            reply,
            written: 0,
            held: false,
            stalled: 0,
        });
    }

    /// The watchdog's tick: the most ticks in a row any one reply has held pieces with none written,
    /// and the bytes the transport holds for all of them.
    pub fn tick(&self) -> (u32, u64) {
        let mut f = self.replies.lock();
        let (mut most, mut unsent) = (0, 0);
        f.replies.retain_mut(|w| {
            let Some(reply) = w.reply.upgrade() else {
                return false;
            };
            let (pieces, bytes, written) = reply.pieces();
            let was_held = std::mem::replace(&mut w.held, pieces > 0);
            if w.held && was_held && written == w.written {
                w.stalled += 1;
            } else {
                w.stalled = 0;
            }
            w.written = written;
            most = most.max(w.stalled);
            unsent += bytes;
            true
        });
        f.prune_at = 2 * f.replies.len();
        (most, unsent)
    }

    /// Closes the connection: its next read or write fails, and its reader is woken for that.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.reader.wake();
    }

    /// For the connection's reads: `Some(error)` once closed; otherwise registers `cx` to be woken by
    /// [`Link::close`].
    pub fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        self.reader.register(cx.waker());
        if self.is_closed() {
            return Poll::Ready(closed_error());
        }
        Poll::Pending
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The connection is gone.
    pub fn end(&self) {
        self.gone.notify_one();
    }

    /// Completes once [`Link::end`] was called.
    pub async fn ended(&self) {
        self.gone.notified().await
    }

    /// The link of a call's connection, from the connection information in its extensions (none for a
    /// call made in-process).
    pub fn from_extensions(ext: &http::Extensions) -> Option<Arc<Link>> {
        connection(ext).and_then(|(_, link)| link.cloned())
    }
}

/// A connection's own information, as the daemon's listeners hand it to each call.
pub enum Conn<'a> {
    Uds(&'a UdsConnectInfo),
    Tcp(&'a TcpConnectInfo),
}

/// The information of a call's connection and its link: the daemon's listeners (`server::conns`) put
/// both in every call's extensions; a server without them (tests) puts the bare information, with no
/// link; a call made in-process has neither.
pub fn connection(ext: &http::Extensions) -> Option<(Conn<'_>, Option<&Arc<Link>>)> {
    if let Some(c) = ext.get::<OnLink<UdsConnectInfo>>() {
        return Some((Conn::Uds(&c.info), Some(&c.link)));
    }
    if let Some(u) = ext.get::<UdsConnectInfo>() {
        return Some((Conn::Uds(u), None));
    }
    let linked = ext.get::<OnLink<TcpConnectInfo>>().or_else(|| {
        ext.get::<TlsConnectInfo<OnLink<TcpConnectInfo>>>()
            .map(|t| t.get_ref())
    });
    if let Some(c) = linked {
        return Some((Conn::Tcp(&c.info), Some(&c.link)));
    }
    ext.get::<TcpConnectInfo>()
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .map(|t| t.get_ref())
        })
        .map(|t| (Conn::Tcp(t), None))
}

/// The error a closed connection's reads and writes return.
pub fn closed_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "closed by the daemon: reply bytes waited for the client's flow-control window (twice \
         --stream-idle-timeout), or no call was open on it for too long",
    )
}

/// A connection's information (tonic's `UdsConnectInfo` or `TcpConnectInfo`) with its [`Link`].
#[derive(Clone)]
pub struct OnLink<I> {
    pub info: I,
    pub link: Arc<Link>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply's pieces as a test sets them: (held, bytes, written).
    #[derive(Default)]
    struct Pieces(Mutex<(usize, u64, u64)>);

    impl Reply for Pieces {
        fn pieces(&self) -> (usize, u64, u64) {
            *self.0.lock()
        }
    }

    /// Each reply's stall is counted apart from its siblings' progress; an ended reply is let go.
    #[test]
    fn a_link_counts_each_replys_stall_and_wakes_its_reader_when_closed() {
        let link = Link::new();
        let (steady, stuck) = (Arc::new(Pieces::default()), Arc::new(Pieces::default()));
        link.follow(Arc::downgrade(&steady) as Weak<dyn Reply>);
        link.follow(Arc::downgrade(&stuck) as Weak<dyn Reply>);
        assert_eq!(link.tick(), (0, 0), "nothing held");
        *stuck.0.lock() = (1, 100, 0);
        for written in 1..=3 {
            *steady.0.lock() = (1, 5, written);
            // Held since the tick before, nothing written: one more tick stalled (the first tick
            // only sees it held).
            assert_eq!(link.tick(), (written as u32 - 1, 105));
        }
        *stuck.0.lock() = (1, 100, 1);
        *steady.0.lock() = (1, 5, 4);
        assert_eq!(link.tick().0, 0, "a piece written");
        drop(stuck);
        *steady.0.lock() = (0, 0, 5);
        assert_eq!(link.tick(), (0, 0));
        assert_eq!(
            link.replies.lock().replies.len(),
            1,
            "the ended reply let go"
        );

        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        struct Count(Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let waker = std::task::Waker::from(Arc::new(Count(woken.clone())));
        let mut cx = Context::from_waker(&waker);
        assert!(link.poll_closed(&mut cx).is_pending());
        link.close();
        assert_eq!(woken.load(Ordering::SeqCst), 1, "the reader is woken");
        match link.poll_closed(&mut cx) {
            Poll::Ready(e) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut),
            Poll::Pending => panic!("a closed link reads on"),
        }
    }
}
