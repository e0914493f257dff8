//! Connections: how many one client may hold, and what happens when the process runs out of descriptors.
//!
//! Every accepted connection holds a descriptor for as long as its client keeps it open, sending
//! something or not. Without a bound, one process opening thousands of connections and sending nothing
//! took every descriptor the daemon had: other tenants' connections then timed out before their
//! HTTP/2 handshake, and the daemon logged nothing. So each listener's accepted connections pass
//! through a [`Gate`]:
//! - one client (a process on a Unix socket, an address on TCP) holds at most [`PER_PROCESS`] /
//!   [`PER_ADDRESS`] connections; beyond that a new one is closed at once, with a log line (at most one
//!   a minute per client, [`RefusalLog::minutely`]);
//! - all clients together hold at most the descriptor limit less [`RESERVED_FDS`] (kept for video files,
//!   arenas and the state directory);
//! - an accept that fails for want of descriptors is logged (once a minute) and the listener pauses
//!   [`EMFILE_PAUSE`] instead of spinning.
//!
//! A closed connection lingers ([`LINGER`]): hyper drops a connection as soon as its last stream has
//! sent its last frame, but the client may still be reading that stream's tail and sending flow-control
//! updates. Closing a socket that receives data answers with a reset, and a reset makes the client's
//! kernel drop what it had received and not yet read: a reply the daemon finished sending during a
//! graceful shutdown ended "broken pipe" on the client, a few bytes short (about 1 in 8 drains in
//! `ops::health_turns_not_serving_on_sigterm_while_a_stream_finishes`). So a dropped connection is
//! handed to a task that shuts down its writing side (the client reads to the end, then EOF) and reads
//! and discards until the client closes, for at most [`LINGER`]; it keeps its place in the counts
//! meanwhile, so shutdown can wait for it ([`Gate::open`]).
//!
//! A connection with a reply waiting for a flow-control window its client never opens is closed: each
//! connection has a [`Link`] that follows its replies and the pieces the transport holds of each, and a
//! watchdog ([`watch`]) that closes the connection when one reply's pieces are held and none was
//! written for twice `--stream-idle-timeout`, however its other replies progress (its reads and writes
//! then fail, and hyper drops its streams, their bytes and budget). hyper polls no reply while its next frame waits for the window, so the reply's own idle
//! reset (`budget::sent`) cannot see this case. Twice: the calls' own idle ends (a stream's, a
//! GetClips reply's, each after `--stream-idle-timeout`) come first and end only the call, with a
//! status the client can read; the connection's close, which ends every call on it, is the backstop.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

use crate::peer::{closed_error, Link, OnLink};
use crate::refusal::RefusalLog;

/// Connections one process may hold on a Unix socket (a client process uses one or two).
pub const PER_PROCESS: usize = 64;
/// Connections one address may hold on TCP (every process of a remote host shares its address).
pub const PER_ADDRESS: usize = 1024;
/// Descriptors kept out of the connections' reach.
pub const RESERVED_FDS: usize = 512;
/// How long a listener waits after an accept failed for want of descriptors.
pub const EMFILE_PAUSE: Duration = Duration::from_millis(100);
/// How long a closed connection waits for its client to close its side (module docs).
pub const LINGER: Duration = Duration::from_secs(5);
/// A TCP connection that has begun no call this long after it was accepted is closed (it holds a
/// descriptor and a place without a token ever being checked: tokens are checked per call).
pub const FIRST_CALL: Duration = Duration::from_secs(10);
/// A TCP connection with no call open for this long is closed; its client's channel connects again
/// at its next call.
pub const QUIET_CLOSE: Duration = Duration::from_secs(300);
/// The share of the total only Unix-socket connections may take (a quarter): TCP clients, however
/// many addresses they come from, cannot take the places the host's trainers connect with.
pub const UNIX_RESERVE_DIVISOR: usize = 4;

/// When a connection with no call open is closed ([`FIRST_CALL`], [`QUIET_CLOSE`] on TCP).
#[derive(Clone, Copy, Debug)]
pub struct Quiet {
    /// Before its first call.
    pub first_call: Duration,
    /// After its last call ended.
    pub between_calls: Duration,
}

impl Quiet {
    pub const TCP: Quiet = Quiet {
        first_call: FIRST_CALL,
        between_calls: QUIET_CLOSE,
    };
}

/// Who holds a connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    Process(i32),
    Address(IpAddr),
    /// No credentials (counted only in the total).
    Unknown,
}

/// The connection counts of every listener of one daemon.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Mutex<Counts>>,
    total_limit: usize,
}

#[derive(Default)]
struct Counts {
    by_holder: HashMap<Holder, usize>,
    total: usize,
}

impl Gate {
    /// A gate for this process's descriptor limit (`RLIMIT_NOFILE`).
    pub fn new() -> Gate {
        Gate::with_total(descriptor_limit().saturating_sub(RESERVED_FDS).max(64))
    }

    pub fn with_total(total_limit: usize) -> Gate {
        Gate {
            inner: Arc::new(Mutex::new(Counts::default())),
            total_limit,
        }
    }

    /// Admits a connection of `holder`, or None (with a log line) when it is over a bound.
    fn admit(&self, holder: Holder) -> Option<Ticket> {
        let limit = match holder {
            Holder::Process(_) => PER_PROCESS,
            Holder::Address(_) => PER_ADDRESS,
            Holder::Unknown => usize::MAX,
        };
        let mut c = self.inner.lock();
        let held = c.by_holder.get(&holder).copied().unwrap_or(0);
        let tcp_limit = self.total_limit - self.total_limit / UNIX_RESERVE_DIVISOR;
        let over = if held >= limit {
            Some(format!("{held} connections held, at most {limit} a client"))
        } else if c.total >= self.total_limit {
            Some(format!(
                "{} connections open, at most {} (the descriptor limit less {RESERVED_FDS})",
                c.total, self.total_limit
            ))
        } else if matches!(holder, Holder::Address(_)) && c.total >= tcp_limit {
            Some(format!(
                "{} connections open, at most {tcp_limit} with TCP clients (the rest of the {} are kept \
                 for Unix-socket clients)",
                c.total, self.total_limit
            ))
        } else {
            None
        };
        if let Some(why) = over {
            let client = holder.describe();
            if let Some(suppressed) =
                RefusalLog::minutely().note_at(&client, "connections", Instant::now())
            {
                tracing::warn!(%client, suppressed, "connection closed at once: {why}");
            }
            return None;
        }
        *c.by_holder.entry(holder.clone()).or_insert(0) += 1;
        c.total += 1;
        Some(Ticket {
            gate: self.clone(),
            holder,
        })
    }

    fn accept_failed(e: &std::io::Error) {
        if let Some(suppressed) =
            RefusalLog::minutely().note_at("listener", "accept", Instant::now())
        {
            tracing::warn!(error = %e, suppressed, "cannot accept a connection");
        }
    }

    /// Connections open now, lingering ones included.
    pub fn open(&self) -> usize {
        self.inner.lock().total
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

/// The soft `RLIMIT_NOFILE` (1024 when unknown).
fn descriptor_limit() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return 1024;
    }
    r.rlim_cur as usize
}

impl Holder {
    /// For log lines: `pid 4242`, `10.0.0.7`, `unknown`.
    pub fn describe(&self) -> String {
        match self {
            Holder::Process(pid) => format!("pid {pid}"),
            Holder::Address(ip) => ip.to_string(),
            Holder::Unknown => "unknown".into(),
        }
    }
}

/// A connection's place in the counts, given back when the connection closes.
struct Ticket {
    gate: Gate,
    holder: Holder,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut c = self.gate.inner.lock();
        if let Some(n) = c.by_holder.get_mut(&self.holder) {
            *n -= 1;
            if *n == 0 {
                c.by_holder.remove(&self.holder);
            }
        }
        c.total -= 1;
    }
}

/// An accepted connection counted by a [`Gate`].
pub struct Counted<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> {
    /// Taken by the linger task when the connection is dropped.
    io: Option<IO>,
    ticket: Option<Ticket>,
    link: Arc<Link>,
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> Counted<IO> {
    fn io(&mut self) -> Pin<&mut IO> {
        Pin::new(
            self.io
                .as_mut()
                .expect("a connection in use has its socket"),
        )
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> Drop for Counted<IO> {
    fn drop(&mut self) {
        self.link.end();
        let (Some(mut io), ticket) = (self.io.take(), self.ticket.take()) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let _ticket = ticket;
            let drain = async {
                let _ = io.shutdown().await;
                let mut buf = [0u8; 4096];
                while matches!(io.read(&mut buf).await, Ok(n) if n > 0) {}
            };
            let _ = tokio::time::timeout(LINGER, drain).await;
        });
    }
}

/// Passes `incoming` through `gate`: connections over a bound are closed at once, failed accepts are
/// logged and paused on. Each admitted connection is watched ([`watch`]: for replies stalled twice
/// `idle`, `--stream-idle-timeout`, when it is not zero; for `quiet` when given).
pub fn gated<IO, S>(
    incoming: S,
    gate: Gate,
    holder: fn(&IO) -> Holder,
    idle: Duration,
    quiet: Option<Quiet>,
) -> impl Stream<Item = std::io::Result<Counted<IO>>>
where
    S: Stream<Item = std::io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    incoming
        .then(move |accepted| {
            let gate = gate.clone();
            async move {
                match accepted {
                    Ok(io) => {
                        let who = holder(&io);
                        gate.admit(who.clone()).map(|t| {
                            let link = Link::new();
                            let stall = (!idle.is_zero()).then_some(idle * 2);
                            if stall.is_some() || quiet.is_some() {
                                tokio::spawn(watch(link.clone(), stall, quiet, who));
                            }
                            Ok(Counted {
                                io: Some(io),
                                ticket: Some(t),
                                link,
                            })
                        })
                    }
                    Err(e) => {
                        Gate::accept_failed(&e);
                        if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                            tokio::time::sleep(EMFILE_PAUSE).await;
                        }
                        None
                    }
                }
            }
        })
        .filter_map(|x| x)
}

/// Closes `link`'s connection once one reply's pieces are held and none of them was written for
/// `stall`, whatever its other replies do (checked every quarter of it: closed after `stall` to
/// `1.25 stall`), or once it has had no call open for
/// `quiet`'s time (first call, between calls; checked every quarter of the shorter, at most every
/// second); ends with the connection.
pub async fn watch(link: Arc<Link>, stall: Option<Duration>, quiet: Option<Quiet>, holder: Holder) {
    let tick = [
        stall.map(|s| s / 4),
        quiet.map(|q| (q.first_call.min(q.between_calls) / 4).min(Duration::from_secs(1))),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(Duration::from_secs(1))
    .max(Duration::from_millis(10));
    loop {
        tokio::select! {
            _ = link.ended() => return,
            _ = tokio::time::sleep(tick) => {}
        }
        if let (Some(q), Some((quiet_for, had_calls))) = (quiet, link.quiet()) {
            let limit = if had_calls {
                q.between_calls
            } else {
                q.first_call
            };
            if quiet_for >= limit {
                tracing::info!(
                    client = %holder.describe(),
                    seconds = quiet_for.as_secs_f64(),
                    "connection closed: {}",
                    if had_calls {
                        "no call open for that long"
                    } else {
                        "no call begun since it was accepted"
                    }
                );
                link.close();
                return;
            }
        }
        let Some(idle) = stall else {
            continue;
        };
        // Ticks in a row that one reply's pieces were held, held at the tick before, and none written
        // since: the pieces held then have waited that many ticks (a piece leaves only by being
        // written or dropped).
        let (stalled, unsent_bytes) = link.tick();
        if tick * stalled < idle {
            continue;
        }
        tracing::warn!(
            client = %holder.describe(),
            seconds = idle.as_secs_f64(),
            unsent_bytes,
            "connection closed: a reply's bytes waited for the client's flow-control window and none \
             was written (twice --stream-idle-timeout); the connection's calls end, and their budget and \
             stream slots are released"
        );
        link.close();
        return;
    }
}

/// The holder of a Unix-socket connection: its process, from the kernel's credentials.
pub fn unix_holder(s: &tokio::net::UnixStream) -> Holder {
    match s.peer_cred().ok().and_then(|c| c.pid()) {
        Some(pid) => Holder::Process(pid),
        None => Holder::Unknown,
    }
}

/// The holder of a TCP connection: its address.
pub fn tcp_holder(s: &tokio::net::TcpStream) -> Holder {
    match s.peer_addr() {
        Ok(a) => Holder::Address(a.ip()),
        Err(_) => Holder::Unknown,
    }
}

impl<IO: Connected + AsyncRead + AsyncWrite + Unpin + Send + 'static> Connected for Counted<IO> {
    type ConnectInfo = OnLink<IO::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        OnLink {
            info: self
                .io
                .as_ref()
                .expect("a connection in use has its socket")
                .connect_info(),
            link: self.link.clone(),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Poll::Ready(e) = self.link.poll_closed(cx) {
            return Poll::Ready(Err(e));
        }
        self.io().poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncWrite for Counted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.link.is_closed() {
            return Poll::Ready(Err(closed_error()));
        }
        self.io().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io().poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.link.is_closed() {
            return Poll::Ready(Err(closed_error()));
        }
        self.io().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply's pieces as a test sets them: (held, bytes, written).
    #[derive(Default)]
    struct Pieces(parking_lot::Mutex<(usize, u64, u64)>);

    impl crate::peer::Reply for Pieces {
        fn pieces(&self) -> (usize, u64, u64) {
            *self.0.lock()
        }
    }

    fn follow(link: &Link) -> Arc<Pieces> {
        let reply = Arc::new(Pieces::default());
        link.follow(Arc::downgrade(&reply) as std::sync::Weak<dyn crate::peer::Reply>);
        reply
    }

    /// The watchdog closes a connection only when one reply's pieces were held and none written for the
    /// whole idle time: a slow but steady reader keeps it, pieces held for less than the idle time keep
    /// it, a sibling reply's progress does not keep it, and it ends with the connection.
    #[tokio::test(start_paused = true)]
    async fn the_watchdog_closes_only_a_connection_whose_pieces_wait_the_idle_time() {
        let idle = Duration::from_secs(8);
        let start = tokio::time::Instant::now();
        let link = Link::new();
        let dog = tokio::spawn(watch(link.clone(), Some(idle), None, Holder::Process(1)));
        // A reader writing one piece every 7 s of 8: never closed.
        let steady = follow(&link);
        for written in 1..=6 {
            *steady.0.lock() = (2, 20, written - 1);
            tokio::time::sleep(Duration::from_secs(7)).await;
            *steady.0.lock() = (1, 10, written);
            assert!(!link.is_closed(), "a steady reader was cut off");
        }
        // Nothing held for long: never closed.
        *steady.0.lock() = (0, 0, 7);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!link.is_closed());
        // One reply held with nothing written while its sibling writes a piece every second: closed
        // after 8 to 10 s.
        let stuck = follow(&link);
        *stuck.0.lock() = (1, 10, 0);
        let stall = tokio::time::Instant::now();
        let mut written = 7;
        while !link.is_closed() {
            written += 1;
            *steady.0.lock() = (1, 10, written);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let waited = stall.elapsed();
        assert!(
            waited >= idle && waited <= idle + idle / 4 + Duration::from_secs(1),
            "closed after {waited:?}"
        );
        dog.await.unwrap();
        assert!(start.elapsed() > Duration::from_secs(80));

        // A connection that goes ends its watchdog.
        let link = Link::new();
        let dog = tokio::spawn(watch(link.clone(), Some(idle), None, Holder::Unknown));
        *follow(&link).0.lock() = (1, 1, 0);
        tokio::time::sleep(Duration::from_secs(3)).await;
        link.end();
        tokio::time::timeout(Duration::from_secs(1), dog)
            .await
            .expect("the watchdog ends with its connection")
            .unwrap();
        assert!(!link.is_closed());
    }

    /// A TCP connection that begins no call within the first-call time is closed; one with a call open
    /// is kept however long the call takes; one whose calls ended is closed after the quiet time.
    #[tokio::test(start_paused = true)]
    async fn a_connection_without_calls_is_closed_after_its_quiet_time() {
        let quiet = Quiet {
            first_call: Duration::from_secs(10),
            between_calls: Duration::from_secs(60),
        };
        let closed_after = |link: Arc<Link>| async move {
            let t0 = tokio::time::Instant::now();
            while !link.is_closed() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            t0.elapsed()
        };
        // Never a call: closed after 10 s (to 10 s + a tick).
        let link = Link::new();
        let dog = tokio::spawn(watch(link.clone(), None, Some(quiet), Holder::Unknown));
        let waited = closed_after(link).await;
        assert!(
            waited >= Duration::from_secs(10) && waited <= Duration::from_secs(12),
            "{waited:?}"
        );
        dog.await.unwrap();

        // A call open for 5 minutes keeps it; 60 s after the call ends it is closed.
        let link = Link::new();
        let dog = tokio::spawn(watch(
            link.clone(),
            Some(Duration::from_secs(8)),
            Some(quiet),
            Holder::Unknown,
        ));
        link.call_began();
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert!(!link.is_closed(), "closed with a call open");
        link.call_ended();
        let waited = closed_after(link).await;
        assert!(
            waited >= Duration::from_secs(59) && waited <= Duration::from_secs(62),
            "{waited:?}"
        );
        dog.await.unwrap();
    }

    /// TCP clients, from any number of addresses, take at most three quarters of the total; the rest
    /// is kept for Unix-socket clients.
    #[test]
    fn tcp_clients_leave_a_quarter_of_the_places_to_unix_clients() {
        let gate = Gate::with_total(40);
        let held: Vec<Ticket> = (0..30)
            .map(|i| {
                gate.admit(Holder::Address(format!("10.0.0.{i}").parse().unwrap()))
                    .expect("below three quarters")
            })
            .collect();
        assert!(gate
            .admit(Holder::Address("10.0.1.1".parse().unwrap()))
            .is_none());
        let unix: Vec<Ticket> = (0..10)
            .map(|i| gate.admit(Holder::Process(100 + i)).expect("kept for Unix"))
            .collect();
        assert!(gate.admit(Holder::Process(200)).is_none(), "the total");
        drop((held, unix));
        assert_eq!(gate.open(), 0);
    }

    #[test]
    fn a_client_over_its_bound_is_refused_and_a_closed_connection_frees_its_place() {
        let gate = Gate::with_total(PER_PROCESS + 2);
        let _c = gate
            .admit(Holder::Address("10.0.0.1".parse().unwrap()))
            .unwrap();
        let a = Holder::Process(7);
        let held: Vec<Ticket> = (0..PER_PROCESS)
            .map(|_| gate.admit(a.clone()).unwrap())
            .collect();
        assert!(
            gate.admit(a.clone()).is_none(),
            "over the per-process bound"
        );
        let b = gate.admit(Holder::Process(8)).expect("another process");
        assert_eq!(gate.open(), PER_PROCESS + 2);
        assert!(gate.admit(Holder::Process(9)).is_none(), "over the total");
        drop(b);
        assert!(gate.admit(Holder::Process(9)).is_some(), "a place freed");
        drop(held);
        assert!(gate.admit(a).is_some());
    }
}
