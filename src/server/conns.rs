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
//! - the processes of one user together hold at most a [`USER_SHARE_DIVISOR`]th of the total on Unix
//!   sockets: short-lived children each connecting 64 times and passing the descriptors to one process
//!   (`SCM_RIGHTS`) took all 19,488 places in 8 s, and every other tenant's new connection failed for as
//!   long as they were held (probe C, D1); the kernel's credentials of a connection stay its connector's;
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
/// The share of the total one user's Unix-socket connections may take (a quarter; at least four
/// processes' worth, [`PER_PROCESS`] each).
pub const USER_SHARE_DIVISOR: usize = 4;
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
    /// A process (pid) of a user (uid) on a Unix socket.
    Process(i32, u32),
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
    by_user: HashMap<u32, usize>,
    total: usize,
}

impl Gate {
    /// A gate for this process's descriptor limit (`RLIMIT_NOFILE`, its soft limit raised to the hard
    /// one first: a soft 1024, the usual default outside systemd units, left one user 128 places).
    pub fn new() -> Gate {
        raise_descriptor_limit();
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
            Holder::Process(..) => PER_PROCESS,
            Holder::Address(_) => PER_ADDRESS,
            Holder::Unknown => usize::MAX,
        };
        let mut c = self.inner.lock();
        let held = c.by_holder.get(&holder).copied().unwrap_or(0);
        let tcp_limit = self.total_limit - self.total_limit / UNIX_RESERVE_DIVISOR;
        let user_limit = (self.total_limit / USER_SHARE_DIVISOR).max(4 * PER_PROCESS);
        let user = match holder {
            Holder::Process(_, uid) => Some((uid, c.by_user.get(&uid).copied().unwrap_or(0))),
            _ => None,
        };
        // Each refusal with the key its log lines are thinned by: a bound of one client, of one user
        // (however many processes it forks), of all clients together.
        let over = if held >= limit {
            Some((
                format!("{held} connections held, at most {limit} a client"),
                holder.describe(),
            ))
        } else if let Some((uid, n)) = user.filter(|&(_, n)| n >= user_limit) {
            Some((
                format!(
                    "uid {uid}'s processes hold {n} connections, at most {user_limit} a user (a \
                     quarter of the {})",
                    self.total_limit
                ),
                format!("uid {uid}"),
            ))
        } else if c.total >= self.total_limit {
            Some((
                format!(
                    "{} connections open, at most {} (the descriptor limit less {RESERVED_FDS})",
                    c.total, self.total_limit
                ),
                "all clients".to_owned(),
            ))
        } else if matches!(holder, Holder::Address(_)) && c.total >= tcp_limit {
            Some((
                format!(
                    "{} connections open, at most {tcp_limit} with TCP clients (the rest of the {} are \
                     kept for Unix-socket clients)",
                    c.total, self.total_limit
                ),
                "tcp clients".to_owned(),
            ))
        } else {
            None
        };
        if let Some((why, key)) = over {
            if let Some(suppressed) =
                RefusalLog::minutely().note_at(&key, "connections", Instant::now())
            {
                let client = holder.describe();
                tracing::warn!(%client, suppressed, "connection closed at once: {why}");
            }
            return None;
        }
        *c.by_holder.entry(holder.clone()).or_insert(0) += 1;
        if let Some((uid, _)) = user {
            *c.by_user.entry(uid).or_insert(0) += 1;
        }
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

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (at most 2^20), as servers do at start.
fn raise_descriptor_limit() {
    let Some(mut r) = nofile() else { return };
    let want = r.rlim_max.min(1 << 20);
    if r.rlim_cur < want {
        r.rlim_cur = want;
        // SAFETY: setrlimit reads the struct given.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    }
}

/// The soft `RLIMIT_NOFILE` (1024 when unknown).
fn descriptor_limit() -> usize {
    match nofile() {
        Some(r) if r.rlim_cur != libc::RLIM_INFINITY => r.rlim_cur as usize,
        _ => 1024,
    }
}

/// `RLIMIT_NOFILE`, None when it cannot be read.
fn nofile() -> Option<libc::rlimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct given.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0).then_some(r)
}

impl Holder {
    /// For log lines: `pid 4242`, `10.0.0.7`, `unknown`.
    pub fn describe(&self) -> String {
        match self {
            Holder::Process(pid, uid) => format!("pid {pid} (uid {uid})"),
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
        give_back(&mut c.by_holder, &self.holder);
        if let Holder::Process(_, uid) = self.holder {
            give_back(&mut c.by_user, &uid);
        }
        c.total -= 1;
    }
}

/// One place of `key` given back; its entry goes with its last place.
fn give_back<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
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
                // A line a minute per client: one opening a thousand idle connections wrote a thousand.
                let client = holder.describe();
                let key = if had_calls { "quiet" } else { "no call" };
                if let Some(suppressed) =
                    RefusalLog::minutely().note_at(&client, key, Instant::now())
                {
                    tracing::info!(
                        %client,
                        suppressed,
                        seconds = quiet_for.as_secs_f64(),
                        "connection closed: {}",
                        if had_calls {
                            "no call open for that long"
                        } else {
                            "no call begun since it was accepted"
                        }
                    );
                }
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

/// The holder of a Unix-socket connection: its process and user, from the kernel's credentials (its
/// connector's, wherever the descriptor is passed on).
pub fn unix_holder(s: &tokio::net::UnixStream) -> Holder {
    match s.peer_cred().ok().and_then(|c| Some((c.pid()?, c.uid()))) {
        Some((pid, uid)) => Holder::Process(pid, uid),
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
#[path = "conns_tests.rs"]
mod tests;
