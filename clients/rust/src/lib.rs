//! Rust client for the vserve daemon.
//!
//! ```no_run
//! # async fn demo() -> Result<(), vserve_client::ClientError> {
//! use vserve_client::{proto, Client};
//! let mut client = Client::connect("unix:/run/vserve/vserve.sock").await?;
//! let batch = client
//!     .get_clips(proto::GetClipsRequest {
//!         dataset: "kin".into(),
//!         clips: vec![vserve_client::clip_frames("a/b.mp4", &[0, 5, 9])],
//!         transform: None,
//!         ..Default::default()
//!     })
//!     .await?;
//! assert_eq!(batch.data.len() as u64, batch.header.nbytes);
//! # Ok(()) }
//! ```
//!
//! Addresses are `unix:/path/to.sock`, `HOST:PORT`, `http://HOST:PORT` or `https://HOST:PORT` (verified
//! with [`ConnectOptions::tls_ca_pem`], else the system's roots); [`Client::connect_with`] also sends a
//! bearer token, refused over an unencrypted connection to another host. `GetClips`
//! replies arrive as chunks; [`Client::get_clips`] reassembles them into one [`Batch`].
//!
//! `GetClipsRequest::cache_policy` and `StreamBatchesRequest::cache_policy` ([`proto::CachePolicy`])
//! say whether the decoded frames may enter the daemon's frame cache: `Auto` (the default: unless a
//! request's frames of one video are a scan larger than the daemon's `--cache-admit-fraction` of its
//! cache), `OnePass` (never: frames read once do not displace other jobs' cached frames) or `Keep`.

use std::path::PathBuf;

use tonic::transport::{Channel, Endpoint, Uri};

/// Generated protobuf and gRPC client types of `vserve.v1`.
pub mod proto {
    tonic::include_proto!("vserve.v1");
}

use proto::v_serve_client::VServeClient;

/// The largest single message the client accepts; the daemon sends 8 MiB chunks.
const MAX_MESSAGE_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("UNAVAILABLE: cannot connect to {addr:?}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("INVALID_ARGUMENT: bad address {0:?}: expected unix:/path.sock, HOST:PORT or http://HOST:PORT")]
    BadAddress(String),
    #[error("{}: {}", code_name(.0.code()), .0.message())]
    Status(tonic::Status),
    #[error("INTERNAL: malformed reply: {0}")]
    Protocol(String),
    /// A shared-memory reply this process cannot open: the daemon is on another host, in another
    /// container (another /dev/shm), or another user's. The same request with `Transport::Inline`
    /// gets the bytes.
    #[error("INTERNAL: {0} (the daemon is on another host or container, or another user's: ask Transport::Inline)")]
    ShmUnreachable(String),
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> ClientError {
        ClientError::Status(connection_failed(status))
    }
}

/// A call whose connection failed, as gRPC names it: UNAVAILABLE (what callers retry), with the cause.
/// tonic names it UNKNOWN "transport error", or CANCELLED "operation was canceled" (hyper's request
/// dropped with its connection), when the connection fails under the call rather than before it: a
/// daemon closing a connection at once (its client, its user or all clients at a connection limit) got
/// UNAVAILABLE, UNKNOWN or CANCELLED by run (probe C, D5). Statuses the daemon sent, and those of no
/// transport error, pass unchanged.
fn connection_failed(status: tonic::Status) -> tonic::Status {
    use std::error::Error;
    if !matches!(status.code(), tonic::Code::Unknown | tonic::Code::Cancelled) {
        return status;
    }
    let mut cause = status.source();
    let mut transport = false;
    let mut chain = Vec::new();
    while let Some(e) = cause {
        transport |= e.is::<tonic::transport::Error>();
        chain.push(e.to_string());
        cause = e.source();
    }
    if !transport {
        return status;
    }
    chain.dedup();
    tonic::Status::unavailable(format!(
        "connection to the daemon failed: {} (the daemon stopped, restarted or closed the connection: \
         it closes a new one at once when this process, its user or all clients hold as many as it \
         allows, and one whose replies go unread while others wait; see its log)",
        chain.join(": ")
    ))
}

impl ClientError {
    /// The gRPC status name (`NOT_FOUND`, ...) this error carries.
    pub fn code_name(&self) -> &'static str {
        match self {
            ClientError::Connect { .. } => "UNAVAILABLE",
            ClientError::BadAddress(_) => "INVALID_ARGUMENT",
            ClientError::Status(s) => code_name(s.code()),
            ClientError::Protocol(_) | ClientError::ShmUnreachable(_) => "INTERNAL",
        }
    }
}

/// The canonical upper-case name of a gRPC status code, as other gRPC implementations print it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Where the daemon listens when `--listen` is not given: `$XDG_RUNTIME_DIR/vserve/vserve.sock`, else
/// `/run/vserve/vserve.sock` for root, else `/tmp/vserve-$USER/vserve.sock`.
pub fn default_socket_path() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("vserve").join("vserve.sock");
    }
    let user = std::env::var("USER").unwrap_or_default();
    if user == "root" || (user.is_empty() && std::path::Path::new("/run").is_dir()) {
        return PathBuf::from("/run/vserve/vserve.sock");
    }
    PathBuf::from(format!("/tmp/vserve-{user}/vserve.sock"))
}

/// The default address clients use: the default Unix socket.
pub fn default_addr() -> String {
    format!("unix:{}", default_socket_path().display())
}

/// A clip of explicit frame indices.
pub fn clip_frames(video: &str, frames: &[u64]) -> proto::ClipSpec {
    proto::ClipSpec {
        video: video.to_owned(),
        positions: Some(proto::clip_spec::Positions::Frames(proto::FrameIndices {
            indices: frames.to_vec(),
        })),
        stream: None,
        expect_version: None,
    }
}

/// A clip of timestamps in seconds.
pub fn clip_times(video: &str, seconds: &[f64]) -> proto::ClipSpec {
    proto::ClipSpec {
        video: video.to_owned(),
        positions: Some(proto::clip_spec::Positions::Times(proto::Timestamps {
            seconds: seconds.to_vec(),
        })),
        stream: None,
        expect_version: None,
    }
}

/// One reassembled `GetClips` reply or `StreamBatches` batch: the header and the array's bytes (little-endian, C order).
#[derive(Debug, Clone)]
pub struct Batch {
    pub header: proto::BatchHeader,
    pub data: Vec<u8>,
}

impl Batch {
    pub fn shape(&self) -> &[u64] {
        &self.header.shape
    }

    pub fn dtype(&self) -> proto::DType {
        self.header.dtype()
    }
}

/// How to reach a daemon beyond its address: a bearer token for a daemon started with
/// `--auth-token-file`, and the CA certificate that signed an `https://` daemon's certificate.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    /// Sent as `authorization: Bearer <token>` with every call.
    pub token: Option<String>,
    /// PEM CA certificate to verify the daemon with (`https://` addresses; without it, the system's
    /// roots). A token goes only to `https://`, a Unix socket or a loopback address.
    pub tls_ca_pem: Option<Vec<u8>>,
}

/// Whether `uri`'s host is this host's loopback (`localhost`, 127.0.0.0/8, ::1).
fn is_loopback(uri: &Uri) -> bool {
    let host = uri
        .host()
        .unwrap_or("")
        .trim_start_matches('[')
        .trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Adds the bearer token, if any, to every call.
#[derive(Clone, Default)]
pub struct BearerToken(Option<tonic::metadata::AsciiMetadataValue>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.write_str(if self.0.is_some() {
            "BearerToken(..)"
        } else {
            "BearerToken(none)"
        })
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

type Authed = tonic::service::interceptor::InterceptedService<Channel, BearerToken>;

/// A connection to one daemon. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    inner: VServeClient<Authed>,
}

impl Client {
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        Self::connect_with(addr, &ConnectOptions::default()).await
    }

    /// Connects with a bearer token and/or a CA certificate for TLS.
    pub async fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Self, ClientError> {
        let token = match &options.token {
            Some(t) => Some(
                format!("Bearer {}", t.trim())
                    .parse::<tonic::metadata::AsciiMetadataValue>()
                    .map_err(|_| {
                        ClientError::Status(tonic::Status::invalid_argument(
                            "the token must be printable ASCII",
                        ))
                    })?,
            ),
            None => None,
        };
        let connect_err = |e: tonic::transport::Error| ClientError::Connect {
            addr: addr.to_owned(),
            reason: source_chain(&e),
        };
        let channel = if let Some(path) = addr.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            // The URI is required by the HTTP layer but never dialled: the connector below opens the socket.
            let endpoint = tune(Endpoint::from_static("http://localhost"));
            endpoint
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
                .map_err(connect_err)?
        } else {
            let uri = if addr.starts_with("http://") || addr.starts_with("https://") {
                addr.to_owned()
            } else {
                format!("http://{addr}")
            };
            let secure = uri.starts_with("https://");
            let mut endpoint = tune(
                Endpoint::from_shared(uri).map_err(|_| ClientError::BadAddress(addr.to_owned()))?,
            );
            if token.is_some() && !secure && !is_loopback(endpoint.uri()) {
                // A bearer token in clear text over the network is a token given away (the Python
                // client refused it; the CLI and this client sent it: probe F).
                return Err(ClientError::Status(tonic::Status::invalid_argument(
                    format!(
                    "refusing to send the token over an unencrypted connection to {addr:?}; use \
                     https://HOST:PORT (the daemon's --tls-cert) or a Unix socket"
                ),
                )));
            }
            if secure {
                // The CA given, else the system's roots (as the Python client does): without either, an
                // https:// address failed "Connecting to HTTPS without TLS enabled".
                let tls = match &options.tls_ca_pem {
                    Some(ca) => tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
                    None => tonic::transport::ClientTlsConfig::new().with_native_roots(),
                };
                endpoint = endpoint.tls_config(tls).map_err(connect_err)?;
            }
            endpoint.connect().await.map_err(connect_err)?
        };
        let inner = VServeClient::with_interceptor(channel, BearerToken(token))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Client { inner })
    }

    pub async fn probe(
        &mut self,
        req: proto::ProbeRequest,
    ) -> Result<proto::ProbeResponse, ClientError> {
        Ok(self.inner.probe(req).await?.into_inner())
    }

    /// Checks a dataset inside the daemon (CheckDataset): one message per video as it finishes.
    pub async fn check_dataset(
        &mut self,
        req: proto::CheckDatasetRequest,
    ) -> Result<tonic::Streaming<proto::CheckDatasetResponse>, ClientError> {
        Ok(self.inner.check_dataset(req).await?.into_inner())
    }

    /// Every dataset served, with its labels.
    pub async fn list_datasets(&mut self) -> Result<proto::ListDatasetsResponse, ClientError> {
        self.list_datasets_with(proto::ListDatasetsRequest::default())
            .await
    }

    /// ListDatasets for one dataset and/or without labels (`omit_labels`).
    pub async fn list_datasets_with(
        &mut self,
        req: proto::ListDatasetsRequest,
    ) -> Result<proto::ListDatasetsResponse, ClientError> {
        Ok(self.inner.list_datasets(req).await?.into_inner())
    }

    /// Makes the daemon walk its dataset roots again and re-read its manifests (Reload); replies
    /// when done.
    pub async fn reload(&mut self) -> Result<proto::ReloadResponse, ClientError> {
        Ok(self
            .inner
            .reload(proto::ReloadRequest {})
            .await?
            .into_inner())
    }

    /// The crash quarantine after clearing `clear` (every entry with `all`); clearing needs the daemon's
    /// uid or root on its Unix socket (PERMISSION_DENIED otherwise).
    pub async fn quarantine(
        &mut self,
        clear: Vec<String>,
        all: bool,
    ) -> Result<proto::QuarantineResponse, ClientError> {
        Ok(self
            .inner
            .quarantine(proto::QuarantineRequest { clear, all })
            .await?
            .into_inner())
    }

    pub async fn stats(&mut self) -> Result<proto::GetStatsResponse, ClientError> {
        Ok(self
            .inner
            .get_stats(proto::GetStatsRequest {})
            .await?
            .into_inner())
    }

    /// The generated gRPC client, for callers that manage replies and slots themselves.
    pub fn raw(&mut self) -> &mut VServeClient<Authed> {
        &mut self.inner
    }

    /// Gives back shared-memory slots (the batch methods do this themselves).
    pub async fn release_slots(&mut self, arena: &str, slots: &[u32]) -> Result<(), ClientError> {
        self.inner
            .release_slots(proto::ReleaseSlotsRequest {
                arena: arena.to_owned(),
                slots: slots.to_vec(),
            })
            .await?;
        Ok(())
    }

    /// Opens a stream of batches (one rank's share of one epoch).
    pub async fn stream_batches(
        &mut self,
        req: proto::StreamBatchesRequest,
    ) -> Result<BatchStream, ClientError> {
        let inner = self.inner.stream_batches(req).await?.into_inner();
        Ok(BatchStream {
            inner,
            client: self.inner.clone(),
            arena: None,
            releases_off: false,
        })
    }

    /// Fetches clips and reassembles the chunked reply into one array.
    pub async fn get_clips(
        &mut self,
        mut req: proto::GetClipsRequest,
    ) -> Result<Batch, ClientError> {
        // Over shared memory the reply is copied out before its slot is released, so the daemon may
        // reuse the arena for the next reply.
        req.reuse_arena |= req.transport == proto::Transport::Shm as i32;
        let mut stream = self.inner.get_clips(req).await?.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| ClientError::Protocol("empty reply stream".into()))?;
        let header = first
            .header
            .clone()
            .ok_or_else(|| ClientError::Protocol("first message has no header".into()))?;
        let nbytes = usize::try_from(header.nbytes)
            .map_err(|_| ClientError::Protocol(format!("array of {} bytes", header.nbytes)))?;
        if let Some(slot) = &header.shm {
            let data = read_slot(slot, nbytes, &mut None);
            // Given back whether or not it could be read: an unreadable slot would wait for expiry.
            let released = release(&mut self.inner, slot).await;
            let data = data?;
            released?;
            return Ok(Batch { header, data });
        }
        let mut data = Vec::with_capacity(nbytes);
        let mut append = |msg: proto::GetClipsResponse| -> Result<(), ClientError> {
            if msg.offset != data.len() as u64 {
                return Err(ClientError::Protocol(format!(
                    "chunk at offset {} but {} bytes received",
                    msg.offset,
                    data.len()
                )));
            }
            if data.len() + msg.data.len() > nbytes {
                return Err(ClientError::Protocol(format!(
                    "chunks exceed the announced {nbytes} bytes"
                )));
            }
            data.extend_from_slice(&msg.data);
            Ok(())
        };
        append(first)?;
        while let Some(msg) = stream.message().await? {
            append(msg)?;
        }
        if data.len() != nbytes {
            return Err(ClientError::Protocol(format!(
                "received {} of {nbytes} bytes",
                data.len()
            )));
        }
        Ok(Batch { header, data })
    }
}

/// The batches of one `StreamBatches` call, reassembled one at a time.
pub struct BatchStream {
    inner: tonic::Streaming<proto::StreamBatchesResponse>,
    /// For ReleaseSlots (transport SHM).
    client: VServeClient<Authed>,
    /// The stream's arena, mapped once (transport SHM).
    arena: Option<(String, memmap2::Mmap)>,
    /// A release failed UNAVAILABLE: no more are sent (see [`BatchStream::next`]).
    releases_off: bool,
}

/// Gives a slot back once its bytes are copied out.
async fn release(
    client: &mut VServeClient<Authed>,
    slot: &proto::ShmSlot,
) -> Result<(), ClientError> {
    client
        .release_slots(proto::ReleaseSlotsRequest {
            arena: slot.arena.clone(),
            slots: vec![slot.slot],
        })
        .await?;
    Ok(())
}

/// Reads an array out of a shared-memory slot.
fn read_slot(
    slot: &proto::ShmSlot,
    nbytes: usize,
    mapped: &mut Option<(String, memmap2::Mmap)>,
) -> Result<Vec<u8>, ClientError> {
    if mapped.as_ref().is_none_or(|(p, _)| *p != slot.path) {
        let file = std::fs::File::open(&slot.path).map_err(|e| {
            ClientError::ShmUnreachable(format!("cannot open shared memory {}: {e}", slot.path))
        })?;
        // SAFETY: the daemon writes a slot only before announcing it and after the client released
        // it, so the bytes read here do not change while they are copied.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| {
            ClientError::Protocol(format!("cannot map shared memory {}: {e}", slot.path))
        })?;
        *mapped = Some((slot.path.clone(), map));
    }
    let (_, map) = mapped.as_ref().expect("mapped above");
    let start = slot.offset as usize;
    map.get(start..start + nbytes)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| {
            ClientError::Protocol(format!(
                "slot at {start}+{nbytes} outside the {}-byte arena",
                map.len()
            ))
        })
}

impl BatchStream {
    /// The next batch, or None after the last one. Dropping the stream cancels it on the server.
    pub async fn next(&mut self) -> Result<Option<Batch>, ClientError> {
        let Some(first) = self.inner.message().await? else {
            return Ok(None);
        };
        let header = first
            .header
            .clone()
            .ok_or_else(|| ClientError::Protocol("batch starts without a header".into()))?;
        let nbytes = usize::try_from(header.nbytes)
            .map_err(|_| ClientError::Protocol(format!("array of {} bytes", header.nbytes)))?;
        if let Some(slot) = &header.shm {
            let data = read_slot(slot, nbytes, &mut self.arena)?;
            if !self.releases_off {
                match release(&mut self.client, slot).await {
                    // A daemon shutting down takes no new call (its listener is closed) while the
                    // stream's last batches and its status are on their way: read them, so that the
                    // stream ends with the daemon's status ("server is shutting down"), not this
                    // release's "connection closed". An ended stream's arena goes with it.
                    Err(ClientError::Status(s)) if s.code() == tonic::Code::Unavailable => {
                        self.releases_off = true;
                    }
                    other => other?,
                }
            }
            return Ok(Some(Batch { header, data }));
        }
        let mut data = Vec::with_capacity(nbytes);
        let mut msg = first;
        loop {
            if msg.offset != data.len() as u64 || data.len() + msg.data.len() > nbytes {
                return Err(ClientError::Protocol(format!(
                    "chunk of {} bytes at offset {} does not continue {} of {nbytes} bytes",
                    msg.data.len(),
                    msg.offset,
                    data.len()
                )));
            }
            data.extend_from_slice(&msg.data);
            if data.len() == nbytes {
                break;
            }
            msg = match self.inner.message().await? {
                Some(m) if m.header.is_none() => m,
                Some(_) => {
                    return Err(ClientError::Protocol(format!(
                        "next batch began after {} of {nbytes} bytes",
                        data.len()
                    )))
                }
                None => {
                    return Err(ClientError::Protocol(format!(
                        "stream ended after {} of {nbytes} bytes",
                        data.len()
                    )))
                }
            };
        }
        Ok(Some(Batch { header, data }))
    }
}

/// HTTP/2 receive windows and frames sized for multi-megabyte replies (the defaults, 64 KiB windows and
/// 16 KiB frames, throttle them).
/// How long a TCP connect may take.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// HTTP/2 pings: one every interval while the connection is open, and a peer that has not answered one
/// within the timeout is given up (the call ends UNAVAILABLE). A peer that accepts connections and never
/// answers (a hung process, something else on the port) used to keep a call waiting forever; a busy
/// daemon answers pings at once, so long calls are not cut.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn tune(endpoint: Endpoint) -> Endpoint {
    endpoint
        .initial_stream_window_size(16 << 20)
        .initial_connection_window_size(64 << 20)
        .max_frame_size(1 << 20)
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        // An error that prints its source already (io errors wrapped as themselves): said once.
        let text = inner.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = inner.source();
    }
    s
}
