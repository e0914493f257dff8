//! vserve: a per-host daemon that decodes video clips once for every trainer rank on the host and serves
//! frame-exact batches over gRPC.
//!
//! Modules in pipeline order (upstream first; a module names only modules above it, checked by
//! `tests/layering.rs`):
//!
//! ```text
//! client ──gRPC──► api ──► handle::{probe, clips, stream, check} ──► catalog ──► dataset, manifest, gulp
//!                                │                                      ├──► index (table) ◄── decode::ffmpeg::scan
//!                                │                                      └──► store (tables, health) ◄── check
//!                                ├──► request (types, validation, geometry)
//!                                ├──► frames ──► cache, plan (GOP runs) ──► decode::fleet ──► backends
//!                                └──► batch (crop, flip, dtype, layout) ──► transport (inline | shm)
//! client ◄──chunks / shm slot── api ◄──┘
//! ```
//!
//! A plain GetClips reply over shared memory short-cuts the last two steps: its arena is taken before
//! the fetch (`transport::shm::PendingReply`) and the decoders convert the frames that bypass the cache
//! straight into it (`decode::sink`); `handle::clips` fills the rest and publishes it.
//!
//! - Pure stages: [`config`], [`state`] (the state directory), [`dataset`] (paths checked and opened
//!   beneath the root), [`journal`] (crash journal and quarantine), [`manifest`], [`sample`] (what to
//!   read), [`index`] (frame tables), [`store`] (frame tables and health kept in the state directory),
//!   [`plan`] (how: GOP runs), [`gulp`] (the GulpIO format), [`decode`] (backends and the fleet of named
//!   threads), [`check`] (a dataset's health: every video decoded whole, into the store), [`cache`],
//!   [`batch`], [`transport`].
//! - [`error`]: one `Error` and the one [`error::Code`] table (gRPC statuses, skipped-sample reports).
//!   [`budget`]: the in-flight memory budget (`--max-inflight-bytes`, per client `--client-inflight-bytes`) every request and stream reserves
//!   its bytes from before any work.
//! - [`request`]: domain request types, validation, geometry. [`catalog`]: datasets, frame tables, failure
//!   memory. [`frames`]: cache + single flight + fleet. [`engine`]: wires them. [`handle`]: one module per
//!   RPC's logic. [`api`]: proto ↔ domain, statuses at the edge.
//! - Operating: [`metrics`] (one registry), [`refusal`] (refusal lines rate-limited per client and
//!   limit), [`admission`] (per-client and global limits, a reserve for light clients), [`rpc`] (per-call
//!   metrics), [`auth`] (bearer token on TCP), [`admin`] (`/metrics`, `/livez`, `/readyz`), [`server`]
//!   (listeners, `run(config, shutdown)`, drain), [`shutdown`] (signals).
//! - [`cli`] (flags) and [`commands`] (client subcommands, `doctor`, `ingest`, `gulp-check`, `check`).

pub mod admin;
pub mod admission;
pub mod api;
pub mod auth;
pub mod batch;
pub mod budget;
pub mod cache;
pub mod catalog;
pub mod check;
pub mod cli;
pub mod commands;
pub mod config;
pub mod dataset;
pub mod decode;
pub mod engine;
pub mod error;
pub mod frames;
pub mod gulp;
pub mod handle;
pub mod index;
pub mod journal;
pub mod manifest;
pub mod metrics;
pub mod peer;
pub mod plan;
pub mod refusal;
pub mod request;
pub mod rpc;
pub mod sample;
pub mod server;
pub mod shutdown;
pub mod state;
pub mod store;
pub mod transport;
