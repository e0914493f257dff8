//! vserve: a per-host daemon that decodes video clips once for every trainer rank on the host and serves
//! frame-exact batches over gRPC.
//!
//! Modules in pipeline order, one stage each (dependencies point downstream):
//!
//! ```text
//! client ──gRPC──► api ──► engine ──► dataset (resolve a path inside a root)
//!                            │    ──► index   (frame table per video, one packet scan)
//!                            │    ──► cache   (decoded frames, byte-bounded)
//!                            │    ──► plan    (wanted frames → GOP runs)
//!                            │    ──► decode  (fleet of named threads; ffmpeg backend; fake backend)
//!                            └──► batch  (crop, flip, dtype, layout → one array)
//! client ◄──chunks── api ◄───────┘
//! ```
//!
//! - [`cli`] and [`config`]: flags, env and TOML into a validated [`config::Config`]; [`doctor`]: what
//!   this host decodes with (FFmpeg, CUDA driver, GPUs, the `--gpus` choice).
//! - [`server`]: listeners (Unix socket, TCP), `run(config, shutdown)`; [`shutdown`]: signals.
//! - [`error`]: the crate's error kinds; [`api`] maps them to gRPC statuses, once, at the edge.
//! - Operating: [`metrics`] (one registry), [`rpc`] (per-call metrics and `--max-streams` admission via
//!   [`limits`]), [`auth`] (bearer token on TCP), [`admin`] (`/metrics`, `/livez`, `/readyz`).
//! - [`gulp`]: GulpIO datasets (chunked JPEG frames): reader, writer, `vserve ingest`, `vserve gulp-check`.
//!   A dataset whose root holds chunks is served by id through the same stages; its frames are decoded by
//!   [`decode::gulp`].

pub mod admin;
pub mod api;
pub mod auth;
pub mod batch;
pub mod cache;
pub mod catalog;
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
pub mod limits;
pub mod manifest;
pub mod metrics;
pub mod plan;
pub mod request;
pub mod rpc;
pub mod sample;
pub mod server;
pub mod shutdown;
pub mod transport;
