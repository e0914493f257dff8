//! Request bodies while they arrive. A unary request's message is decoded only once its body is whole,
//! and until then tonic holds what has arrived, outside every other budget: a client that announced
//! large messages and never finished sending them held gigabytes (16 MiB on each of 256 streams of each
//! connection) with no call ever starting, so nothing was logged or refused.
//!
//! Each body is therefore bounded here, before any handler runs:
//! - it must arrive whole within [`BODY_TIMEOUT`] of the call's start, else the call ends
//!   DEADLINE_EXCEEDED;
//! - the bytes one client's unfinished bodies hold are bounded by [`CLIENT_HELD`], and all clients'
//!   together by [`TOTAL_HELD`]; past either, the body that crosses it ends RESOURCE_EXHAUSTED.
//!
//! Both end the call with a named status, logged through the refusal log. A body's bytes count from
//! their arrival until the body is dropped (after its message is decoded). Clients are told apart by
//! their peer key (a process on the Unix socket, an address on TCP), hashed into [`BUCKETS`] counters:
//! two clients sharing a counter share its bound, and the table never grows.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::peer::Peer;

/// How long a request body may take to arrive whole, from the call's start.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes one client's unfinished request bodies may hold.
pub const CLIENT_HELD: u64 = 32 << 20;
/// Bytes all clients' unfinished request bodies may hold together.
pub const TOTAL_HELD: u64 = 256 << 20;
/// Counters clients are hashed into.
pub const BUCKETS: usize = super::calls::BUCKETS;

/// The held bytes: one counter per bucket of clients, and the total.
pub struct Ledger {
    buckets: Vec<AtomicU64>,
    total: AtomicU64,
    client_cap: u64,
    total_cap: u64,
    timeout: Duration,
}

impl Ledger {
    pub fn new(client_cap: u64, total_cap: u64, timeout: Duration) -> Ledger {
        Ledger {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            total: AtomicU64::new(0),
            client_cap,
            total_cap,
            timeout,
        }
    }

    /// The daemon's ledger.
    pub fn global() -> &'static Ledger {
        static LEDGER: LazyLock<Ledger> =
            LazyLock::new(|| Ledger::new(CLIENT_HELD, TOTAL_HELD, BODY_TIMEOUT));
        &LEDGER
    }

    fn bucket_of(peer: &Peer) -> usize {
        super::calls::bucket(&peer.key)
    }

    /// Counts `n` more bytes for a bucket; Err(the bound crossed) when they cross one (still counted:
    /// the body's drop gives them back).
    fn add(&self, bucket: usize, n: u64) -> Result<(), &'static str> {
        let client = self.buckets[bucket].fetch_add(n, Ordering::Relaxed) + n;
        let total = self.total.fetch_add(n, Ordering::Relaxed) + n;
        if client > self.client_cap {
            Err("this client's unfinished request bodies")
        } else if total > self.total_cap {
            Err("all clients' unfinished request bodies")
        } else {
            Ok(())
        }
    }

    fn give_back(&self, bucket: usize, n: u64) {
        self.buckets[bucket].fetch_sub(n, Ordering::Relaxed);
        self.total.fetch_sub(n, Ordering::Relaxed);
    }

    /// Bytes held in all.
    #[cfg(test)]
    pub fn held(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// A request body under the bounds above.
pub struct Guarded<B> {
    inner: Pin<Box<B>>,
    ledger: &'static Ledger,
    bucket: usize,
    counted: u64,
    deadline: Pin<Box<tokio::time::Sleep>>,
    ended: bool,
    method: &'static str,
    client: String,
}

impl<B> Guarded<B> {
    pub fn new(inner: B, ledger: &'static Ledger, peer: &Peer, method: &'static str) -> Guarded<B> {
        Guarded {
            inner: Box::pin(inner),
            ledger,
            bucket: Ledger::bucket_of(peer),
            counted: 0,
            deadline: Box::pin(tokio::time::sleep(ledger.timeout)),
            ended: false,
            method,
            client: peer.describe(),
        }
    }

    fn refuse(&self, status: tonic::Status) -> tonic::Status {
        crate::refusal::RefusalLog::global().log(self.method, &self.client, status.message());
        status
    }
}

impl<B> HttpBody for Guarded<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    this.counted += n;
                    if let Err(what) = this.ledger.add(this.bucket, n) {
                        let status = tonic::Status::resource_exhausted(format!(
                            "request body refused: {what} hold more than the daemon allows ({} MiB for one client, {} MiB in all); send whole requests",
                            this.ledger.client_cap >> 20,
                            this.ledger.total_cap >> 20
                        ));
                        return Poll::Ready(Some(Err(this.refuse(status))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                Poll::Ready(Some(Err(tonic::Status::from_error(e.into()))))
            }
            Poll::Ready(None) => {
                this.ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if !this.ended && this.deadline.as_mut().poll(cx).is_ready() {
                    let status = tonic::Status::deadline_exceeded(format!(
                        "request body not received whole within {:?} of the call's start ({} bytes arrived)",
                        this.ledger.timeout,
                        this.counted
                    ));
                    return Poll::Ready(Some(Err(this.refuse(status))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Guarded<B> {
    fn drop(&mut self) {
        self.ledger.give_back(self.bucket, self.counted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that yields `chunks` chunks of `size` bytes, then waits forever without ending.
    struct Trickle {
        chunks: usize,
        size: usize,
    }

    impl HttpBody for Trickle {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.chunks == 0 {
                return Poll::Pending;
            }
            self.chunks -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![0u8; self.size])))))
        }
    }

    async fn next<B: HttpBody<Data = Bytes, Error = tonic::Status> + Unpin>(
        b: &mut B,
    ) -> Option<Result<Frame<Bytes>, tonic::Status>> {
        std::future::poll_fn(|cx| Pin::new(&mut *b).poll_frame(cx)).await
    }

    fn leak(ledger: Ledger) -> &'static Ledger {
        Box::leak(Box::new(ledger))
    }

    #[tokio::test]
    async fn a_body_that_stops_arriving_ends_deadline_exceeded() {
        let ledger = leak(Ledger::new(1 << 20, 4 << 20, Duration::from_millis(50)));
        let peer = Peer::unix(Some(4242), 1000);
        let mut body = Guarded::new(
            Trickle {
                chunks: 1,
                size: 100,
            },
            ledger,
            &peer,
            "Probe",
        );
        assert!(next(&mut body).await.unwrap().is_ok());
        assert_eq!(ledger.held(), 100);
        let err = next(&mut body).await.unwrap().unwrap_err();
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
        assert!(
            err.message().contains("100 bytes arrived"),
            "{}",
            err.message()
        );
        drop(body);
        assert_eq!(ledger.held(), 0, "a dropped body gives its bytes back");
    }

    #[tokio::test]
    async fn one_client_cannot_hold_more_than_its_share() {
        let ledger = leak(Ledger::new(1 << 20, 4 << 20, Duration::from_millis(50)));
        let greedy = Peer::unix(Some(4242), 1000);
        let mut bodies: Vec<_> = (0..4)
            .map(|_| {
                Guarded::new(
                    Trickle {
                        chunks: 8,
                        size: 64 << 10,
                    },
                    ledger,
                    &greedy,
                    "GetStats",
                )
            })
            .collect();
        // 4 bodies x 4 chunks x 64 KiB = 1 MiB: within the client's bound.
        for b in &mut bodies {
            for _ in 0..4 {
                assert!(next(b).await.unwrap().is_ok());
            }
        }
        let err = next(&mut bodies[0]).await.unwrap().unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("this client's"), "{}", err.message());
        // Another client is not refused for the first one's bytes.
        let other = Peer::unix(Some(5151), 2000);
        let mut fine = Guarded::new(
            Trickle {
                chunks: 1,
                size: 64 << 10,
            },
            ledger,
            &other,
            "Probe",
        );
        assert!(next(&mut fine).await.unwrap().is_ok());
        drop(bodies);
        drop(fine);
        assert_eq!(ledger.held(), 0);
    }
}
