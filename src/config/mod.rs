//! Validated configuration: one sub-config per stage, built from flags, `VSERVE_*` env and a TOML file.
//!
//! Precedence: flag > environment > config file > default. The file uses the flags' names:
//!
//! ```toml
//! listen = ["unix:/run/vserve/vserve.sock", "127.0.0.1:7070"]
//! dataset = ["kin=/data/k400"]
//! cache-bytes = "8GiB"
//! decode-threads = 16
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

pub mod load;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "{a}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatasetConfig {
    pub name: String,
    pub root: PathBuf,
    /// The sample list for streams (CSV or JSON Lines); None = every video file under the root.
    pub manifest: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Decoded-frame cache budget.
    pub bytes: u64,
    /// Video-index cache budget.
    pub index_bytes: u64,
    /// Bound on the state directory's store of frame tables and health ([`crate::state`]).
    pub store_bytes: u64,
    /// `--cache-admit-fraction` in millionths: a request's frames of one video needing more of the cache
    /// than this are a scan and do not enter it.
    pub admit_ppm: u32,
}

/// `--cache-admit-fraction`'s default, in millionths: 1/64 (32 MiB of the default 2 GiB cache).
pub const DEFAULT_ADMIT_PPM: u32 = 15_625;

/// Parses `--cache-admit-fraction` (0..=1) into millionths.
pub fn parse_admit_fraction(v: f64) -> Result<u32, ConfigError> {
    if !v.is_finite() || !(0.0..=1.0).contains(&v) {
        return Err(ConfigError::new(
            "cache-admit-fraction",
            v.to_string(),
            "must be 0..=1 (the share of --cache-bytes one video's frames of a request may take)",
        ));
    }
    Ok((v * 1e6).round() as u32)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeConfig {
    /// CPU decode threads (the fleet's parallelism without GPUs).
    pub threads: usize,
    /// Whether `threads` was set (flag, env or file). When GPUs decode and it was not, the fleet has no
    /// CPU decode threads: the NVDEC sessions decode everything, falling back to the CPU on their own
    /// thread for what NVDEC cannot decode, so the host's cores stay free for the trainers.
    pub threads_explicit: bool,
    /// GOP runs that may wait for a decode thread before requests are refused.
    pub queue: usize,
    /// libavcodec threads inside each decoder context.
    pub threads_per_decoder: usize,
    /// Which GPUs decode on NVDEC (`--gpus`); resolved against the driver at start-up.
    pub gpus: GpuSpec,
    /// Decode threads (NVDEC sessions) per GPU in use, in addition to `threads`.
    pub nvdec_sessions: usize,
    /// How long one GOP run may take before its waiters get DEADLINE_EXCEEDED and its thread is
    /// abandoned (`--decode-deadline`).
    pub deadline: std::time::Duration,
    /// How long one index build may take (`--index-deadline`): longer than a run, since a damaged file
    /// is indexed by decoding all of it.
    pub index_deadline: std::time::Duration,
}

/// `--decode-deadline` when not given, seconds.
pub const DEFAULT_DECODE_DEADLINE_S: f64 = 60.0;
/// `--index-deadline` when not given, seconds.
pub const DEFAULT_INDEX_DEADLINE_S: f64 = 600.0;

/// Checks a duration in seconds for `key` where 0 means "off" (or "never"): finite, 0..=`max`, and 0 or at
/// least a millisecond. A positive value below that became a zero `Duration`, silently turning the
/// setting off (`--stream-idle-timeout 1e-20`).
pub fn check_off_or_seconds(
    key: &str,
    seconds: f64,
    max: f64,
) -> Result<std::time::Duration, ConfigError> {
    if !seconds.is_finite() || !(0.0..=max).contains(&seconds) {
        return Err(ConfigError::new(
            key,
            seconds.to_string(),
            format!("must be 0..={max} seconds"),
        ));
    }
    if seconds > 0.0 && seconds < 0.001 {
        return Err(ConfigError::new(
            key,
            seconds.to_string(),
            "must be 0 (off) or at least 0.001 seconds",
        ));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// Checks a deadline in seconds (0.1 to 86400) for `key`.
pub fn check_deadline(key: &str, seconds: f64) -> Result<std::time::Duration, ConfigError> {
    if seconds.is_finite() && (0.1..=86_400.0).contains(&seconds) {
        Ok(std::time::Duration::from_secs_f64(seconds))
    } else {
        Err(ConfigError::new(
            key,
            seconds.to_string(),
            "must be 0.1..=86400 seconds",
        ))
    }
}

/// `--gpus`: which GPUs to decode on. Resolved against what the CUDA driver reports by
/// [`crate::decode::gpus::resolve`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum GpuSpec {
    /// Every GPU when a driver and devices exist, else the CPU.
    #[default]
    Auto,
    /// The CPU only.
    None,
    /// Every GPU; fails without a driver or devices.
    All,
    /// These ordinals (sorted, unique); fails unless each exists.
    List(Vec<u32>),
}

impl std::fmt::Display for GpuSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuSpec::Auto => write!(f, "auto"),
            GpuSpec::None => write!(f, "none"),
            GpuSpec::All => write!(f, "all"),
            GpuSpec::List(l) => {
                let s: Vec<String> = l.iter().map(|g| g.to_string()).collect();
                write!(f, "{}", s.join(","))
            }
        }
    }
}

/// NVDEC sessions per GPU when `--nvdec-sessions` is not given.
pub const DEFAULT_NVDEC_SESSIONS: usize = 4;

/// Parses `--gpus`: `auto`, `none`, `all`, or a comma list of GPU ordinals (`0,1`).
pub fn parse_gpus(s: &str) -> Result<GpuSpec, ConfigError> {
    let t = s.trim();
    match t.to_ascii_lowercase().as_str() {
        "auto" => return Ok(GpuSpec::Auto),
        "none" => return Ok(GpuSpec::None),
        "all" => return Ok(GpuSpec::All),
        _ => {}
    }
    let mut list = Vec::new();
    for part in t.split(',') {
        let ordinal = part.trim().parse::<u32>().map_err(|_| {
            ConfigError::new(
                "gpus",
                s,
                "expected auto, none, all or a comma list of GPU ordinals such as 0,1",
            )
        })?;
        if ordinal > 1023 {
            return Err(ConfigError::new("gpus", s, "GPU ordinals are 0..=1023"));
        }
        list.push(ordinal);
    }
    list.sort_unstable();
    list.dedup();
    Ok(GpuSpec::List(list))
}

/// Checks `--nvdec-sessions` (1..=32).
pub fn check_nvdec_sessions(n: usize) -> Result<usize, ConfigError> {
    if (1..=32).contains(&n) {
        Ok(n)
    } else {
        Err(ConfigError::new(
            "nvdec-sessions",
            n.to_string(),
            "must be 1..=32",
        ))
    }
}

/// Per-request bounds, checked before any allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_frames: usize,
    pub max_clips: usize,
    pub max_side: u32,
    pub max_output_bytes: u64,
    /// Batches a stream may prepare ahead of its reader.
    pub max_prefetch: usize,
    /// Concurrent streaming calls (GetClips, StreamBatches); beyond it calls get RESOURCE_EXHAUSTED.
    pub max_streams: usize,
    /// The in-flight memory budget ([`crate::budget`]): bytes all requests and streams together may hold
    /// in decoded frames waiting for assembly, output arrays and prepared stream batches.
    pub max_inflight_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frames: 16_384,
            max_clips: 4_096,
            max_side: 8_192,
            max_output_bytes: 4 << 30,
            max_prefetch: 8,
            max_streams: 64,
            max_inflight_bytes: 4 << 30,
        }
    }
}

/// What one client may hold of the shared daemon, and what all of them may hold of shared memory.
/// A client is a process on a Unix socket (peer credentials) or an address on TCP ([`crate::peer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenancy {
    /// Streaming calls (GetClips, StreamBatches) of one client at once; `None`: half of `max-streams`.
    pub client_streams: Option<usize>,
    /// Unary calls that do work (Probe, ListDatasets) in flight at once, from everyone...
    pub max_unary: usize,
    /// ... and from one client.
    pub client_unary: usize,
    /// Shared-memory arena bytes of all clients; `None`: 3/4 of the shm directory's filesystem.
    pub shm_bytes: Option<u64>,
    /// Arena bytes of one client; `None`: half of `shm-bytes`.
    pub client_shm_bytes: Option<u64>,
    /// In-flight bytes ([`crate::budget`]) of one client; `None`: half of `max-inflight-bytes`.
    pub client_inflight_bytes: Option<u64>,
    /// The last places of `max-streams`, kept for clients holding fewer than their fair share
    /// ([`crate::admission`]); `None`: an eighth of `max-streams`.
    pub reserved_streams: Option<usize>,
    /// The last bytes of `max-inflight-bytes`, kept the same way; `None`: an eighth of it.
    pub reserved_inflight_bytes: Option<u64>,
    /// A stream whose client takes no batch and releases no slot for this long is ended
    /// (DEADLINE_EXCEEDED); zero never ends one.
    pub stream_idle: std::time::Duration,
}

impl Default for Tenancy {
    fn default() -> Self {
        Tenancy {
            client_streams: None,
            max_unary: 64,
            client_unary: 16,
            shm_bytes: None,
            client_shm_bytes: None,
            client_inflight_bytes: None,
            reserved_streams: None,
            reserved_inflight_bytes: None,
            stream_idle: std::time::Duration::from_secs(600),
        }
    }
}

impl Tenancy {
    /// Streams one client may hold under `max_streams`.
    pub fn client_streams(&self, max_streams: usize) -> usize {
        self.client_streams
            .unwrap_or((max_streams / 2).max(1))
            .clamp(1, max_streams.max(1))
    }

    /// Places of `max_streams` kept for clients below their fair share (fewer than `max_streams`).
    pub fn reserved_streams(&self, max_streams: usize) -> usize {
        self.reserved_streams
            .unwrap_or(max_streams / 8)
            .min(max_streams.saturating_sub(1))
    }

    /// In-flight bytes one client may hold of `max_bytes`.
    pub fn client_inflight_bytes(&self, max_bytes: u64) -> u64 {
        self.client_inflight_bytes
            .unwrap_or(max_bytes / 2)
            .clamp(1, max_bytes.max(1))
    }

    /// In-flight bytes of `max_bytes` kept for clients below their fair share.
    pub fn reserved_inflight_bytes(&self, max_bytes: u64) -> u64 {
        self.reserved_inflight_bytes
            .unwrap_or(max_bytes / 8)
            .min(max_bytes.saturating_sub(1))
    }
}

/// `--max-inflight-bytes` when not given: half of what the machine (or the cgroup, if smaller) leaves
/// after the frame cache and the index cache, at least 256 MiB. Read from `/proc/meminfo` (MemTotal, which
/// does not move while the daemon runs, so the effective configuration is stable) and the cgroup's
/// `memory.max` (v2) or `memory.limit_in_bytes` (v1).
pub fn default_inflight_bytes(cache_bytes: u64, index_bytes: u64) -> u64 {
    let (total, cgroup) = host_memory();
    inflight_from_memory(total, cgroup, cache_bytes, index_bytes)
}

/// This host's MemTotal and its cgroup's memory limit, in bytes, where they can be read.
fn host_memory() -> (Option<u64>, Option<u64>) {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok());
    (
        mem_total(&meminfo),
        cgroup.as_deref().and_then(cgroup_limit),
    )
}

/// A byte count for people: `11.7 GiB`, `512.0 KiB`, `750 B` (sizes are read here too: [`parse_bytes`]).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// The memory this host, or its cgroup if lower, has (None where neither can be read).
pub fn host_memory_bytes() -> Option<u64> {
    let (total, cgroup) = host_memory();
    total.into_iter().chain(cgroup).min()
}

/// How many times the host's memory a cache size may be before it is refused as a unit typo
/// ([`check_fits_memory`]); between the memory and this, `vserve serve` warns.
pub const OVER_MEMORY_REFUSED: u64 = 8;

/// Refuses a cache size (`key`) more than [`OVER_MEMORY_REFUSED`] times the memory this host, or its
/// cgroup, has: a unit typo (`1000000TiB`) was taken as given, a cache that grows until the OOM killer
/// stops it (probe G). A size over the memory but within that (a configuration written for a larger
/// host) is warned about when the daemon starts.
pub fn check_fits_memory(key: &str, bytes: u64) -> Result<u64, ConfigError> {
    match host_memory_bytes() {
        Some(memory) if bytes / OVER_MEMORY_REFUSED > memory => Err(ConfigError::new(
            key,
            human_bytes(bytes),
            format!(
                "is more than {OVER_MEMORY_REFUSED} times the {} of memory this host (or its cgroup) has: a unit typo?",
                human_bytes(memory)
            ),
        )),
        _ => Ok(bytes),
    }
}

/// The rule of [`default_inflight_bytes`] on given numbers (no machine: 8 GiB assumed).
pub fn inflight_from_memory(
    mem_total: Option<u64>,
    cgroup_limit: Option<u64>,
    cache_bytes: u64,
    index_bytes: u64,
) -> u64 {
    let machine = match (mem_total, cgroup_limit) {
        (Some(m), Some(c)) => m.min(c),
        (Some(m), None) => m,
        (None, Some(c)) => c,
        (None, None) => 8 << 30,
    };
    let left = machine
        .saturating_sub(cache_bytes)
        .saturating_sub(index_bytes);
    (left / 2).max(256 << 20)
}

/// MemTotal of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A cgroup memory limit file's value; None for `max` (v2) or v1's "unlimited" (a huge number).
fn cgroup_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 60).then_some(v)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub listen: Vec<ListenAddr>,
    pub datasets: Vec<DatasetConfig>,
    pub cache: CacheConfig,
    pub decode: DecodeConfig,
    pub limits: Limits,
    pub tenancy: Tenancy,
    /// How long calls in flight may take to finish after SIGTERM/SIGINT.
    pub shutdown_grace: std::time::Duration,
    /// Where shared-memory arenas are created (transport SHM).
    pub shm_dir: PathBuf,
    /// How often directory datasets are listed again (zero: at start and on SIGHUP only).
    pub rescan_interval: std::time::Duration,
    /// What the daemon remembers across restarts ([`crate::state`]); `None` keeps nothing.
    pub state_dir: Option<PathBuf>,
    /// Admin listener, logs and access control.
    pub ops: OpsConfig,
}

/// Log line format on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// Operating settings: how the daemon is observed and who may call it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpsConfig {
    /// Where `/metrics`, `/livez` and `/readyz` are served over HTTP; `None` disables the listener.
    pub admin_listen: Option<SocketAddr>,
    pub log_format: LogFormat,
    /// Permission bits of the Unix socket files (e.g. 0o660).
    pub socket_mode: u32,
    /// Group owning the Unix socket files (a gid resolved from a name or number at start-up).
    pub socket_group: Option<u32>,
    /// File holding the bearer token TCP callers must send (`authorization: Bearer <token>`).
    pub auth_token_file: Option<PathBuf>,
    /// Certificate chain and private key (PEM) for TLS on the TCP listeners.
    pub tls: Option<TlsFiles>,
    /// Serve a non-loopback TCP listener with no token (`--allow-insecure-tcp`); refused otherwise.
    pub allow_insecure_tcp: bool,
}

impl Default for OpsConfig {
    fn default() -> Self {
        OpsConfig {
            admin_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            log_format: LogFormat::Text,
            socket_mode: 0o660,
            socket_group: None,
            auth_token_file: None,
            tls: None,
            allow_insecure_tcp: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A bad setting: which key, which value, what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("invalid {key} {value:?}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(key: &str, value: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.to_owned(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

pub fn parse_listen(s: &str) -> Result<ListenAddr, ConfigError> {
    if let Some(path) = s.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(ConfigError::new("listen", s, "empty socket path"));
        }
        return Ok(ListenAddr::Unix(PathBuf::from(path)));
    }
    s.parse::<SocketAddr>()
        .map(ListenAddr::Tcp)
        .map_err(|_| ConfigError::new("listen", s, "expected HOST:PORT or unix:/path.sock"))
}

/// Parses `NAME=DIR` or `NAME=DIR:manifest=FILE`.
pub fn parse_dataset(s: &str) -> Result<DatasetConfig, ConfigError> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| ConfigError::new("dataset", s, "expected NAME=DIR[:manifest=FILE]"))?;
    let (root, manifest) = match rest.rsplit_once(":manifest=") {
        Some((root, m)) if !m.is_empty() => (root, Some(PathBuf::from(m))),
        Some(_) => return Err(ConfigError::new("dataset", s, "empty manifest path")),
        None => (rest, None),
    };
    if name.is_empty() || name.contains(['/', '\0']) {
        return Err(ConfigError::new(
            "dataset",
            s,
            "name must be non-empty without '/'",
        ));
    }
    if root.is_empty() {
        return Err(ConfigError::new("dataset", s, "empty directory"));
    }
    Ok(DatasetConfig {
        name: name.to_owned(),
        root: PathBuf::from(root),
        manifest,
    })
}

/// Parses a byte size: `1073741824`, `512MiB`, `8GiB`, `1.5G`, `100M` (K/M/G/T, optional `iB`/`B`;
/// powers of 1024).
pub fn parse_bytes(key: &str, s: &str) -> Result<u64, ConfigError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    if t.starts_with('-') {
        return Err(ConfigError::new(
            key,
            s,
            "negative (a size is at least 0 bytes)",
        ));
    }
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(ConfigError::new(key, s, "unknown unit (use K, M, G, T)")),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| ConfigError::new(key, s, "not a size"))?;
    let v = n * mult as f64;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(ConfigError::new(key, s, "out of range"));
    }
    Ok(v as u64)
}

/// Parses `--admin-listen`: `HOST:PORT`, or `none` to disable the admin listener.
pub fn parse_admin_listen(s: &str) -> Result<Option<SocketAddr>, ConfigError> {
    if s.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    s.trim()
        .parse::<SocketAddr>()
        .map(Some)
        .map_err(|_| ConfigError::new("admin-listen", s, "expected HOST:PORT or none"))
}

pub fn parse_log_format(s: &str) -> Result<LogFormat, ConfigError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(ConfigError::new("log-format", s, "expected text or json")),
    }
}

/// Parses permission bits written in octal (`0660`, `660`, `0o660`).
pub fn parse_socket_mode(s: &str) -> Result<u32, ConfigError> {
    let t = s.trim();
    let digits = t.strip_prefix("0o").unwrap_or(t);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if !digits.is_empty() && m <= 0o777 => Ok(m),
        _ => Err(ConfigError::new(
            "socket-mode",
            s,
            "expected octal permission bits such as 0660",
        )),
    }
}

/// Resolves `--socket-group`: a numeric gid, or a group name looked up in `group_file` (`/etc/group`).
pub fn parse_socket_group(s: &str, group_file: &std::path::Path) -> Result<u32, ConfigError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(ConfigError::new("socket-group", s, "empty group"));
    }
    if let Ok(gid) = t.parse::<u32>() {
        return Ok(gid);
    }
    let text = std::fs::read_to_string(group_file).map_err(|e| {
        ConfigError::new(
            "socket-group",
            s,
            format!("cannot read {}: {e}", group_file.display()),
        )
    })?;
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let gid = fields.nth(1)?.parse::<u32>().ok()?;
            (name == t).then_some(gid)
        })
        .next()
        .ok_or_else(|| {
            ConfigError::new(
                "socket-group",
                s,
                format!("no such group in {}", group_file.display()),
            )
        })
}

/// Checks that a file a setting names can be read now (so a typo fails at start-up, not later).
pub fn check_readable(key: &str, path: &std::path::Path) -> Result<(), ConfigError> {
    std::fs::File::open(path)
        .map(|_| ())
        .map_err(|e| ConfigError::new(key, path.display().to_string(), e.to_string()))
}

/// Reads a bearer token file: its content without surrounding whitespace, non-empty, printable ASCII.
pub fn read_token(key: &str, path: &std::path::Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(key, path.display().to_string(), e.to_string()))?;
    let token = text.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            key,
            path.display().to_string(),
            "the token must be one non-empty line of printable ASCII",
        ));
    }
    Ok(token.to_owned())
}

/// The default state directory: `$STATE_DIRECTORY` (set by systemd's `StateDirectory=`), else
/// `$XDG_STATE_HOME/vserve`, else `/var/lib/vserve` for root, else `$HOME/.local/state/vserve`.
pub fn default_state_dir() -> Option<std::path::PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    };
    if let Some(d) = env("STATE_DIRECTORY") {
        // systemd may pass several, separated by ':'; the first is ours.
        let first = d
            .to_string_lossy()
            .split(':')
            .next()
            .map(std::path::PathBuf::from);
        return first;
    }
    if let Some(d) = env("XDG_STATE_HOME") {
        return Some(d.join("vserve"));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Some(std::path::PathBuf::from("/var/lib/vserve"));
    }
    env("HOME").map(|h| h.join(".local/state/vserve"))
}

/// The store's default bound (`--store-bytes`).
pub const DEFAULT_STORE_BYTES: u64 = 1 << 30;

#[cfg(test)]
mod tests;
