//! The server: binds every listen address, serves the API (plus gRPC health and reflection) on each until
//! `shutdown` resolves, then turns readiness and health to NOT_SERVING, stops accepting, lets calls in
//! flight finish for up to the grace period (a second signal cuts it short), stops the decode fleet by
//! the end of that period (threads stuck in a read are left behind, so a hung file system cannot hold
//! the exit), and removes the Unix socket files it created. The admin listener (`/metrics`, `/livez`, `/readyz`) runs beside them until the end.
//!
//! `run(config, shutdown)` takes both so tests and `main` drive it the same way. The one metrics registry
//! is created here and handed to the RPC layer and the admin listener.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Identity, ServerTlsConfig};

use crate::admin::AdminState;
use crate::admission::{Admission, ClassLimits};
use crate::api::{Api, VServeServer};
use crate::auth::TokenCheck;
use crate::config::{Config, ListenAddr, OpsConfig};
use crate::decode::select::{select, Backends};
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::rpc::RpcLayer;

mod conns;
pub mod trim;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Setup(String),
    /// Hardware the configuration asks for is missing (`--gpus` naming a GPU or driver not there).
    #[error("{0}")]
    Unavailable(String),
    #[error("cannot listen on {addr}: {reason}")]
    Bind { addr: String, reason: String },
    #[error("server on {addr} failed: {reason}")]
    Serve { addr: String, reason: String },
}

/// The serialized descriptors of `proto/` (written by build.rs), for server reflection.
const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("vserve_descriptor");

/// Serves until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    crate::journal::install_crash_handler();
    // No frame of more than --max-side² pixels is decoded, whatever a file's headers claim.
    crate::decode::ffmpeg::open::set_max_side(config.limits.max_side);
    let backends: Backends = select(&config.decode).map_err(ServerError::Unavailable)?;
    tracing::info!(
        gpus = ?backends.gpus,
        cpu_threads = backends.cpu_threads,
        nvdec_sessions = backends.gpu_threads,
        "{}",
        backends.why
    );
    let engine = Engine::with_threads(
        &config,
        backends.cpu_threads + backends.gpu_threads,
        backends.factory,
    )
    .map_err(ServerError::Setup)?;
    serve_engine(engine, &config, backends.cpu_threads, shutdown).await
}

/// What TCP listeners add: a bearer-token check and TLS, each when configured.
struct TcpAccess {
    token: Option<TokenCheck>,
    tls: Option<ServerTlsConfig>,
}

fn tcp_access(ops: &OpsConfig) -> Result<TcpAccess, ServerError> {
    let token = match &ops.auth_token_file {
        Some(path) => Some(TokenCheck::new(
            &crate::config::read_token("auth-token-file", path)
                .map_err(|e| ServerError::Setup(e.to_string()))?,
        )),
        None => None,
    };
    let tls = match &ops.tls {
        Some(files) => {
            let read = |p: &Path| {
                std::fs::read(p)
                    .map_err(|e| ServerError::Setup(format!("cannot read {}: {e}", p.display())))
            };
            let identity = Identity::from_pem(read(&files.cert)?, read(&files.key)?);
            Some(ServerTlsConfig::new().identity(identity))
        }
        None => None,
    };
    Ok(TcpAccess { token, tls })
}

/// Serves an existing engine on the configured listeners until `shutdown` resolves.
pub async fn serve_engine(
    engine: Arc<Engine>,
    config: &Config,
    cpu_threads: usize,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let (listen, grace) = (&config.listen, config.shutdown_grace);
    let total = engine.fleet_threads();
    // The fleet's first `cpu_threads` threads decode on the CPU, the rest are NVDEC sessions.
    let cpu_threads = cpu_threads.min(total);
    let mut metrics = Metrics::new(engine.metrics());
    let weak = Arc::downgrade(&engine);
    metrics.register_scrape(move || {
        weak.upgrade()
            .map_or_else(Vec::new, |e| e.scrape(cpu_threads, total - cpu_threads))
    });
    let metrics = Arc::new(metrics);
    let admission = Admission::new(
        ClassLimits {
            total: config.limits.max_streams,
            per_client: config.tenancy.client_streams(config.limits.max_streams),
            reserved: config.tenancy.reserved_streams(config.limits.max_streams),
        },
        ClassLimits {
            total: config.tenancy.max_unary,
            per_client: config.tenancy.client_unary.min(config.tenancy.max_unary),
            reserved: 0,
        },
    )
    .taking_back(
        take_back_after(engine.stream_idle()),
        metrics.rpc.places_taken_back.clone(),
    );
    // A client short of in-flight bytes takes them back from a reply left unread, as for places.
    let relief = admission.clone();
    engine
        .budget()
        .set_relief(crate::budget::Relief(Box::new(move |peer| {
            relief.relieve(peer)
        })));
    let layer = RpcLayer::new(metrics.rpc.clone(), admission).with_send_idle(engine.stream_idle());
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<VServeServer<Api>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServerError::Setup(format!("reflection: {e}")))?;
    let access = tcp_access(&config.ops)?;
    let live = Arc::downgrade(&engine);
    let admin_state = Arc::new(AdminState::new(metrics.clone()).with_liveness(Box::new(
        move || live.upgrade().map_or(Ok(()), |e| e.liveness()),
    )));
    // SIGHUP: list the directory datasets again now (new and removed videos), without a restart.
    let trim_task = tokio::spawn(trim::run(metrics.rpc.calls.clone()));
    let rescan_task = crate::shutdown::on_hangup({
        let weak = Arc::downgrade(&engine);
        move || {
            if let Some(e) = weak.upgrade() {
                let r = e.catalog().reload();
                tracing::info!(changed = ?r.changed, errors = ?r.errors, "SIGHUP: datasets listed again");
            }
        }
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let (admin_stop_tx, admin_stop_rx) = watch::channel(false);
    let mut admin_task = None;
    if let Some(addr) = config.ops.admin_listen {
        let listener =
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| ServerError::Bind {
                    addr: format!("admin {addr}"),
                    reason: e.to_string(),
                })?;
        let local = listener.local_addr().map_or(addr, |a| a);
        tracing::info!(addr = %local, "admin listening (/metrics, /livez, /readyz)");
        let mut stop = admin_stop_rx.clone();
        admin_task = Some(tokio::spawn(crate::admin::serve(
            listener,
            admin_state.clone(),
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        )));
    }

    let mut tasks = tokio::task::JoinSet::new();
    let mut sockets: Vec<(PathBuf, Option<(u64, u64)>)> = Vec::new();
    // Every listener's connections count against one bound per client and one in all.
    let gate = conns::Gate::new();
    for addr in listen {
        let svc = VServeServer::new(Api::new(engine.clone()))
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(64 << 20);
        let mut stop = stop_rx.clone();
        let until = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let name = addr.to_string();
        match addr {
            ListenAddr::Unix(path) => {
                let listener =
                    bind_unix(path, &config.ops).map_err(|reason| ServerError::Bind {
                        addr: name.clone(),
                        reason,
                    })?;
                sockets.push((path.clone(), socket_identity(path)));
                let incoming = conns::gated(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    gate.clone(),
                    conns::unix_holder,
                    engine.stream_idle(),
                    None,
                );
                tracing::info!(addr = %name, "listening");
                let router = transport()
                    .layer(layer.clone())
                    .add_service(health_service.clone())
                    .add_service(reflection.clone())
                    .add_service(svc);
                tasks.spawn(async move {
                    router
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
                let incoming = conns::gated(
                    tcp_nodelay(tokio_stream::wrappers::TcpListenerStream::new(listener)),
                    gate.clone(),
                    conns::tcp_holder,
                    engine.stream_idle(),
                    Some(conns::Quiet::TCP),
                );
                let mut builder = transport();
                if let Some(tls) = &access.tls {
                    builder = builder
                        .tls_config(tls.clone())
                        .map_err(|e| ServerError::Bind {
                            addr: name.clone(),
                            reason: format!("tls: {e}"),
                        })?;
                }
                tracing::info!(
                    addr = %local,
                    tls = access.tls.is_some(),
                    token = access.token.is_some(),
                    "listening"
                );
                let router = builder
                    .layer(layer.clone())
                    .add_service(health_service.clone());
                let router = match &access.token {
                    Some(check) => router
                        .add_service(InterceptedService::new(reflection.clone(), check.clone()))
                        .add_service(InterceptedService::new(svc, check.clone())),
                    None => router.add_service(reflection.clone()).add_service(svc),
                };
                tasks.spawn(async move {
                    router
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
    admin_state.set_ready(true);
    let mut result = Ok(());
    tokio::select! {
        _ = shutdown => {
            tracing::info!("shutting down: not ready, no new connections; finishing calls in flight");
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
    // Drain: readiness and health first, so probes see NOT_SERVING while calls finish.
    admin_state.set_ready(false);
    health.set_not_serving::<VServeServer<Api>>().await;
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let _ = stop_tx.send(true);
    engine.begin_drain();
    // Everything, the decode threads included, ends within the grace period from here.
    let shutdown_by = std::time::Instant::now() + grace;
    let drain = async {
        while let Some(done) = tasks.join_next().await {
            if let Ok(Err(e)) = done {
                tracing::warn!(error = %e, "listener ended with an error");
            }
        }
    };
    let drained = async {
        drain.await;
        // Connections the drain closed linger until their clients have read every byte
        // (`conns.rs`): the process exiting now would reset them, and a client lose a reply's tail.
        let until = std::time::Instant::now() + conns::LINGER;
        while gate.open() > 0 && std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // Replies and batches sent over shared memory are read from files the exit removes: wait (within
        // the grace period) until each client has mapped what it was sent, or exited.
        let mut waited = false;
        while engine.shm().unmapped_sent() > 0 {
            if !waited {
                waited = true;
                tracing::info!(
                    arenas = engine.shm().unmapped_sent(),
                    "waiting for clients to open the shared memory they were sent"
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = drained => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(grace_s = grace.as_secs_f64(), connections = gate.open(), "grace period over; closing remaining connections (their clients had not read their replies, or calls had not ended)");
        }
        _ = crate::shutdown::signal() => {
            tracing::warn!("second signal; closing remaining connections now");
        }
    }
    tasks.abort_all();
    // Queued decode work finishes while the grace period lasts; threads stuck in a read are left behind.
    let fleet_engine = engine.clone();
    let _ = tokio::task::spawn_blocking(move || fleet_engine.shutdown(shutdown_by)).await;
    for (path, ours) in sockets {
        // Only the socket this daemon bound: a file put at the path since is left alone.
        if ours.is_some() && socket_identity(&path) == ours {
            let _ = std::fs::remove_file(&path);
        }
    }
    let _ = admin_stop_tx.send(true);
    if let Some(task) = admin_task {
        let _ = task.await;
    }
    if let Some(t) = rescan_task {
        t.abort();
    }
    trim_task.abort();
    tracing::info!("stopped");
    result
}

/// Accepted TCP connections with Nagle's algorithm off. With it on, a reply's last small write (the
/// trailers, or a header-only message when the array went through shared memory) waits for the client's
/// ACK of the previous segment, which the client delays by up to 40 ms: a small reply took ~50 ms over
/// TCP against ~5 ms on the Unix socket.
fn tcp_nodelay(
    incoming: tokio_stream::wrappers::TcpListenerStream,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    incoming.map(|accepted| {
        accepted.inspect(|stream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::warn!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
            }
        })
    })
}

/// HTTP/2 settings for large replies: receive windows big enough that a multi-megabyte chunk is not
/// throttled by flow control (the defaults are 64 KiB); and a bound on the streams of one connection.
fn transport() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(16 << 20)
        .initial_connection_window_size(64 << 20)
        .max_frame_size(Some(1 << 20))
        // Calls one connection may hold open at once (advertised in SETTINGS; a client queues the rest):
        // without it one connection could open health watches until the daemon's memory ran out.
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
}

pub use crate::rpc::MAX_REQUEST_BYTES;

/// How long a reply must have waited unread before a refused client may take its stream place back
/// ([`crate::admission`]): `--stream-idle-timeout`, at most [`TAKE_BACK_AFTER`]; never with a zero
/// timeout (no limit).
fn take_back_after(idle: Duration) -> Option<Duration> {
    (!idle.is_zero()).then(|| idle.min(TAKE_BACK_AFTER))
}

/// The longest wait [`take_back_after`] gives: a reply unread this long while another client is refused
/// is not a pipeline being read in turn.
pub const TAKE_BACK_AFTER: Duration = Duration::from_secs(30);

/// HTTP/2 streams one connection may have open at once: well above what a client process uses (its
/// streaming calls are bounded by `--client-streams`, 32 by default).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// Binds a Unix socket, creating its directory and replacing a stale socket file (one nobody answers
/// on), then gives it `--socket-mode` and `--socket-group`. A live socket is never taken over.
fn bind_unix(path: &Path, ops: &OpsConfig) -> Result<tokio::net::UnixListener, String> {
    let listener = bind_unix_file(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(ops.socket_mode))
        .map_err(|e| format!("cannot set mode {:04o}: {e}", ops.socket_mode))?;
    if let Some(gid) = ops.socket_group {
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|e| format!("cannot give the socket to group {gid}: {e}"))?;
    }
    Ok(listener)
}

fn bind_unix_file(path: &Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    // Only a socket nobody answers on is replaced: anything else at the path (a file, a symlink, a
    // directory) is someone's, and was once deleted here.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            let what = crate::dataset::kind_of(&meta);
            return Err(format!(
                "{} exists and is {what}: vserve replaces only a stale socket there",
                path.display()
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err("another server is answering on this socket".into());
        }
        std::fs::remove_file(path).map_err(|e| format!("cannot remove stale socket: {e}"))?;
    }
    tokio::net::UnixListener::bind(path).map_err(|e| e.to_string())
}

/// The identity (device, inode) of the socket file at `path`, if it is a socket.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.file_type()
        .is_socket()
        .then(|| (meta.dev(), meta.ino()))
}
