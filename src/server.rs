//! The server: binds every listen address, serves the API on each until `shutdown` resolves, then stops
//! accepting, lets calls in flight finish for up to the grace period (a second signal cuts it short), and
//! removes the Unix socket files it created.
//!
//! `run(config, shutdown)` takes both so tests and `main` drive it the same way.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use crate::api::{Api, VServeServer};
use crate::config::{Config, ListenAddr};
use crate::decode::ffmpeg::FfmpegBackend;
use crate::decode::fleet::BackendFactory;
use crate::engine::Engine;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Setup(String),
    #[error("cannot listen on {addr}: {reason}")]
    Bind { addr: String, reason: String },
    #[error("server on {addr} failed: {reason}")]
    Serve { addr: String, reason: String },
}

/// The production backend factory: one FFmpeg CPU backend per decode thread.
pub fn ffmpeg_backends(threads_per_decoder: usize) -> BackendFactory {
    Arc::new(move || Box::new(FfmpegBackend::new(threads_per_decoder)))
}

/// Serves until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    let engine = Engine::new(&config, ffmpeg_backends(config.decode.threads_per_decoder))
        .map_err(ServerError::Setup)?;
    serve_engine(engine, &config.listen, config.shutdown_grace, shutdown).await
}

/// Serves an existing engine on `listen` until `shutdown` resolves.
pub async fn serve_engine(
    engine: Arc<Engine>,
    listen: &[ListenAddr],
    grace: std::time::Duration,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let mut sockets: Vec<PathBuf> = Vec::new();
    for addr in listen {
        let svc = VServeServer::new(Api::new(engine.clone()))
            .max_decoding_message_size(16 << 20)
            .max_encoding_message_size(64 << 20);
        let mut stop = stop_rx.clone();
        let until = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let name = addr.to_string();
        match addr {
            ListenAddr::Unix(path) => {
                let listener = bind_unix(path).map_err(|reason| ServerError::Bind {
                    addr: name.clone(),
                    reason,
                })?;
                sockets.push(path.clone());
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                tracing::info!(addr = %name, "listening");
                tasks.spawn(async move {
                    transport()
                        .add_service(svc)
                        .serve_with_incoming_shutdown(incoming, until)
                        .await
                        .map_err(|e| ServerError::Serve {
                            addr: name,
                            reason: e.to_string(),
                        })
                });
            }
            ListenAddr::Tcp(sa) => {
                let listener =
                    tokio::net::TcpListener::bind(sa)
                        .await
                        .map_err(|e| ServerError::Bind {
                            addr: name.clone(),
                            reason: e.to_string(),
                        })?;
                let local = listener
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or(name.clone());
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                tracing::info!(addr = %local, "listening");
                tasks.spawn(async move {
                    transport()
                        .add_service(svc)
                        .serve_with_incoming_shutdown(incoming, until)
                        .await
                        .map_err(|e| ServerError::Serve {
                            addr: local,
                            reason: e.to_string(),
                        })
                });
            }
        }
    }
    let mut result = Ok(());
    tokio::select! {
        _ = shutdown => {
            tracing::info!("shutting down: no new connections; finishing calls in flight");
        }
        Some(done) = tasks.join_next() => {
            // A listener ended on its own: that is a failure; stop the others too.
            result = match done {
                Ok(Ok(())) => Err(ServerError::Setup("a listener stopped unexpectedly".into())),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(ServerError::Setup(format!("listener task failed: {e}"))),
            };
        }
    }
    let _ = stop_tx.send(true);
    engine.begin_drain();
    let drain = async {
        while let Some(done) = tasks.join_next().await {
            if let Ok(Err(e)) = done {
                tracing::warn!(error = %e, "listener ended with an error");
            }
        }
    };
    tokio::select! {
        _ = drain => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(grace_s = grace.as_secs_f64(), "grace period over; closing remaining connections");
        }
        _ = crate::shutdown::signal() => {
            tracing::warn!("second signal; closing remaining connections now");
        }
    }
    tasks.abort_all();
    for path in sockets {
        let _ = std::fs::remove_file(&path);
    }
    tracing::info!("stopped");
    result
}

/// HTTP/2 settings for large replies: receive windows big enough that a multi-megabyte chunk is not
/// throttled by flow control (the defaults are 64 KiB).
fn transport() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(16 << 20)
        .initial_connection_window_size(64 << 20)
        .max_frame_size(Some(1 << 20))
}

/// Binds a Unix socket, creating its directory and replacing a stale socket file (one nobody answers
/// on). A live socket is never taken over.
fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err("another server is answering on this socket".into());
        }
        std::fs::remove_file(path).map_err(|e| format!("cannot remove stale socket: {e}"))?;
    }
    tokio::net::UnixListener::bind(path).map_err(|e| e.to_string())
}
