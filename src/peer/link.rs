//! The connection a call came on: what its replies have handed the transport and not yet written, and
//! a way to close it.
//!
//! hyper stops polling a reply while its next data frame waits for the client's flow-control window,
//! so nothing of the reply's own (its idle reset, `budget::sent`) runs: a client that opens no window
//! kept the reply's budget and stream slot until it closed the connection. Every reply piece is
//! counted on its connection's [`Link`] as well as on its reply, and the connection's watchdog
//! (`server::conns`) closes a connection whose pieces make no progress for twice `--stream-idle-timeout`.
//! [`OnLink`] carries the link in the connection information tonic hands every request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use tokio::sync::Notify;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};

/// One connection's unwritten reply pieces, its open calls, and its close switch.
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
    /// Pieces handed to the transport and not yet dropped by it.
    pieces: AtomicU64,
    /// Their bytes.
    bytes: AtomicU64,
    /// Pieces dropped so far: the watchdog's measure of progress.
    written: AtomicU64,
    /// Set to close the connection: its reads and writes fail from then on.
    closed: AtomicBool,
    /// The connection's reader, woken to see `closed`.
    reader: AtomicWaker,
    /// Told when the connection is gone (ends its watchdog).
    gone: Notify,
}

impl Link {
    pub fn new() -> Arc<Link> {
        Arc::new(Link {
            calls: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            born: tokio::time::Instant::now(),
            quiet_from_ms: AtomicU64::new(0),
            pieces: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            written: AtomicU64::new(0),
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

    /// A reply handed the transport a piece of `bytes`.
    pub fn handed(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.pieces.fetch_add(1, Ordering::Release);
    }

    /// The transport dropped a piece of `bytes` (written, or its stream reset).
    pub fn dropped(&self, bytes: u64) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.written.fetch_add(1, Ordering::Relaxed);
        self.pieces.fetch_sub(1, Ordering::Release);
    }

    /// Pieces held by the transport now.
    pub fn pieces(&self) -> u64 {
        self.pieces.load(Ordering::Acquire)
    }

    /// Their bytes.
    pub fn unsent_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Pieces dropped so far.
    pub fn progress(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
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

    #[test]
    fn a_link_counts_its_pieces_and_wakes_its_reader_when_closed() {
        let link = Link::new();
        link.handed(100);
        link.handed(5);
        assert_eq!(
            (link.pieces(), link.unsent_bytes(), link.progress()),
            (2, 105, 0)
        );
        link.dropped(100);
        assert_eq!(
            (link.pieces(), link.unsent_bytes(), link.progress()),
            (1, 5, 1)
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
