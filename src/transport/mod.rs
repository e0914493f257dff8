//! Transport: how a batch's bytes reach the client.
//!
//! Inline transport is the api's chunked messages. Shared memory ([`shm`]) puts the bytes in a file
//! under /dev/shm that a client on the same host maps; the reply carries only where they are.

pub mod shm;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    #[default]
    Inline,
    Shm,
}
