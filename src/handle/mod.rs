//! One module per RPC's logic, in domain types: [`probe`], [`clips`] (GetClips), [`stream`]
//! (StreamBatches), [`check`] (CheckDataset). Each takes the [`crate::engine::Engine`] and a request from [`crate::request`] (or its
//! own, for streams) and returns domain results; [`crate::api`] converts at the edge.

pub mod check;
pub mod clips;
pub mod probe;
pub mod stream;
