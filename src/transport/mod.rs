//! Transport: how an array's bytes reach the client, decided in one place, [`deliver`] (or, for a
//! GetClips reply whose decoders wrote it in place, [`publish_reply`] once it is filled).
//!
//! Input: where the client asked for the array ([`Destination`]: inline, a GetClips reply's own arena,
//! or a stream's slot it acquired), its size, and a function that writes it. Output: [`Delivered`], the
//! bytes to send in chunked messages (inline) or where they are in shared memory ([`shm`], files a client
//! on the same host maps; the reply carries only the slot). The array is written once, straight into its
//! destination. Bytes are counted once: shared-memory bytes here when written, inline bytes by the RPC
//! layer as they go on the wire (`rpc.rs`), so a reply the client abandons counts only what it received.

pub mod shm;

use std::sync::Arc;

use crate::metrics::{EngineMetrics, TransportLabel};
use crate::peer::Peer;
use shm::{Arena, ShmError, ShmRef, ShmRegistry};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    #[default]
    Inline,
    Shm,
}

/// Where an array goes.
pub enum Destination<'a> {
    /// A buffer of its own, sent in the reply's messages.
    Inline,
    /// A GetClips reply's one-slot arena, owned by `owner` (`reusable`: see
    /// [`ShmRegistry::one_shot_with`]).
    Reply {
        shm: &'a ShmRegistry,
        reusable: bool,
        owner: &'a Peer,
    },
    /// A slot of a stream's arena that the stream acquired.
    Slot { arena: Arc<Arena>, slot: u32 },
}

/// An array delivered.
#[derive(Debug)]
pub enum Delivered {
    Inline(Vec<u8>),
    Shm(ShmRef),
}

impl Delivered {
    /// As a reply holds it: the inline bytes (empty over shm) and the slot (none inline).
    pub fn into_parts(self) -> (Vec<u8>, Option<ShmRef>) {
        match self {
            Delivered::Inline(data) => (data, None),
            Delivered::Shm(r) => (Vec::new(), Some(r)),
        }
    }
}

/// Writes an array of `nbytes` with `write` straight into `to`, and counts shared-memory bytes in
/// `metrics`. Nothing is kept (no arena, no slot) if `write` fails.
pub fn deliver<T, E>(
    to: Destination<'_>,
    nbytes: usize,
    metrics: &EngineMetrics,
    write: impl FnOnce(&mut [u8]) -> Result<T, E>,
) -> Result<(T, Delivered), E>
where
    E: From<ShmError>,
{
    let (v, delivered) = match to {
        Destination::Inline => {
            let mut out = vec![0u8; nbytes];
            let v = write(&mut out)?;
            return Ok((v, Delivered::Inline(out)));
        }
        Destination::Reply {
            shm,
            reusable,
            owner,
        } => {
            let (v, r) = shm.one_shot_with(nbytes, reusable, owner, write)?;
            (v, Delivered::Shm(r))
        }
        Destination::Slot { arena, slot } => {
            let (v, r) = arena.fill(slot, nbytes, write)?;
            (v, Delivered::Shm(r))
        }
    };
    metrics.sent(TransportLabel::SHM, nbytes as u64);
    Ok((v, delivered))
}

/// Publishes a GetClips reply filled in place (decoders converted frames straight into it, see
/// [`shm::PendingReply`]) and counts its bytes, as [`deliver`] counts the replies it writes.
pub fn publish_reply(
    shm: &ShmRegistry,
    reply: &shm::PendingReply,
    reusable: bool,
    metrics: &EngineMetrics,
) -> Result<Delivered, ShmError> {
    let r = shm.publish(reply, reusable)?;
    metrics.sent(TransportLabel::SHM, reply.nbytes() as u64);
    Ok(Delivered::Shm(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_destination_holds_the_same_bytes_and_shm_is_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let reg = ShmRegistry::new(
            dir.path().into(),
            std::time::Duration::from_secs(60),
            shm::ShmBudget {
                total: 1 << 20,
                per_client: 1 << 20,
            },
        )
        .unwrap();
        let metrics = EngineMetrics::default();
        let me = Peer::local();
        let write = |buf: &mut [u8]| -> Result<usize, ShmError> {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (i * 7) as u8;
            }
            Ok(buf.len())
        };
        let expected: Vec<u8> = (0..100).map(|i| (i * 7) as u8).collect();
        let (n, d) = deliver(Destination::Inline, 100, &metrics, write).unwrap();
        assert_eq!(n, 100);
        assert!(matches!(&d, Delivered::Inline(v) if *v == expected));
        assert_eq!(
            metrics.sent_bytes(TransportLabel::SHM),
            0,
            "inline is counted on the wire"
        );
        let (_, d) = deliver(
            Destination::Reply {
                shm: &reg,
                reusable: false,
                owner: &me,
            },
            100,
            &metrics,
            write,
        )
        .unwrap();
        let Delivered::Shm(r) = d else {
            panic!("a reply arena")
        };
        assert_eq!(std::fs::read(&r.path).unwrap()[..100], expected[..]);
        let arena = reg.stream_arena(128, 2, &me).unwrap();
        let slot = arena.try_acquire().unwrap();
        let (_, d) = deliver(
            Destination::Slot {
                arena: arena.clone(),
                slot,
            },
            100,
            &metrics,
            write,
        )
        .unwrap();
        let Delivered::Shm(s) = d else {
            panic!("a slot")
        };
        let bytes = std::fs::read(&s.path).unwrap();
        assert_eq!(bytes[s.offset as usize..][..100], expected[..]);
        assert_eq!(metrics.sent_bytes(TransportLabel::SHM), 200);
        // A failed write keeps nothing.
        let before = reg.open_arenas();
        let failed = deliver(
            Destination::Reply {
                shm: &reg,
                reusable: false,
                owner: &me,
            },
            100,
            &metrics,
            |_| Err::<(), _>(ShmError::UnknownArena("x".into())),
        );
        assert!(failed.is_err());
        assert_eq!(reg.open_arenas(), before);
        assert_eq!(metrics.sent_bytes(TransportLabel::SHM), 200);
    }
}
