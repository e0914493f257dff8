//! From flags, environment and TOML to a validated [`Config`]: the `serve` flags ([`ServeArgs`], clap,
//! every flag with its `VSERVE_*` variable), the TOML file's keys (named as the flags), and
//! [`ServeArgs::to_config`], which takes flag over environment over file over default and checks every
//! value, naming the key and the value it refuses. [`config_to_toml`] prints the effective configuration
//! as a file would state it (`vserve config`).

use std::path::PathBuf;

use clap::Args;

mod tenancy;

use super::{check_nvdec_sessions, parse_gpus, DEFAULT_NVDEC_SESSIONS};
use super::{
    check_readable, parse_admin_listen, parse_log_format, parse_socket_group, parse_socket_mode,
    read_token, OpsConfig, TlsFiles,
};
use super::{
    parse_bytes, parse_dataset, parse_listen, CacheConfig, Config, ConfigError, DecodeConfig,
    Limits, Tenancy,
};

#[derive(Args, Debug, Clone, Default)]
// `--cache-bytes -1` is a bad value to name, not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct ServeArgs {
    /// TOML file with the same settings as the flags.
    #[arg(long, env = "VSERVE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to serve on: HOST:PORT or unix:/path.sock (repeatable). Default: a Unix socket under the
    /// runtime directory.
    #[arg(
        long,
        env = "VSERVE_LISTEN",
        value_delimiter = ',',
        value_name = "ADDR"
    )]
    pub listen: Vec<String>,
    /// A dataset as NAME=DIR, or NAME=DIR:manifest=FILE to stream from a manifest (repeatable; env
    /// VSERVE_DATASET, comma-separated). A flag's value is taken whole: a directory may hold a comma.
    #[arg(long, value_name = "NAME=DIR")]
    pub dataset: Vec<String>,
    /// Decoded-frame cache size (e.g. 8GiB).
    #[arg(long, env = "VSERVE_CACHE_BYTES", value_name = "SIZE")]
    pub cache_bytes: Option<String>,
    /// Memory the in-memory cache of frame tables may hold (default 256MiB; about 1.7 KB a short clip).
    #[arg(long, env = "VSERVE_INDEX_CACHE_BYTES", value_name = "SIZE")]
    pub index_cache_bytes: Option<String>,
    /// Share of the cache one request's frames of one video may need and still enter it (0..=1,
    /// default 1/64); more is a scan, served without entering the cache.
    #[arg(long, env = "VSERVE_CACHE_ADMIT_FRACTION", value_name = "FRACTION")]
    pub cache_admit_fraction: Option<f64>,
    /// CPU decode threads (default: the number of cores; none when GPUs decode, unless set).
    #[arg(long, env = "VSERVE_DECODE_THREADS", value_name = "N")]
    pub decode_threads: Option<usize>,
    /// GPUs to decode on (NVDEC): auto (GPUs if a CUDA driver reports any, else CPU), none, all, or a
    /// list such as 0,1 (start-up fails unless each exists).
    #[arg(long, env = "VSERVE_GPUS", value_name = "LIST")]
    pub gpus: Option<String>,
    /// Decode threads (NVDEC sessions) per GPU in use, in addition to --decode-threads (1..=32, default 4).
    #[arg(long, env = "VSERVE_NVDEC_SESSIONS", value_name = "N")]
    pub nvdec_sessions: Option<usize>,
    /// GOP runs allowed to wait for a decode thread; beyond it requests get RESOURCE_EXHAUSTED.
    #[arg(long, env = "VSERVE_DECODE_QUEUE", value_name = "N")]
    pub decode_queue: Option<usize>,
    /// Seconds one GOP run may take before its requests get DEADLINE_EXCEEDED and its (stuck) thread is
    /// replaced (default 60).
    #[arg(long, env = "VSERVE_DECODE_DEADLINE", value_name = "SECONDS")]
    pub decode_deadline: Option<f64>,
    /// Seconds one video's index build may take before its requests get DEADLINE_EXCEEDED (default 600).
    #[arg(long, env = "VSERVE_INDEX_DEADLINE", value_name = "SECONDS")]
    pub index_deadline: Option<f64>,
    /// Largest number of frames in one request.
    #[arg(long, env = "VSERVE_MAX_FRAMES", value_name = "N")]
    pub max_frames: Option<usize>,
    /// Most batches one stream may prepare ahead of its reader.
    #[arg(long, env = "VSERVE_MAX_PREFETCH", value_name = "N")]
    pub max_prefetch: Option<usize>,
    /// Largest output side in pixels.
    #[arg(long, env = "VSERVE_MAX_SIDE", value_name = "PIXELS")]
    pub max_side: Option<u32>,
    /// Largest array one request may return, and one stream batch (e.g. 4GiB).
    #[arg(long, env = "VSERVE_MAX_OUTPUT_BYTES", value_name = "SIZE")]
    pub max_output_bytes: Option<String>,
    /// Memory all requests and streams together may hold in decoded frames, outputs and prepared
    /// batches (e.g. 16GiB); beyond it they get RESOURCE_EXHAUSTED. Default: half of the machine's (or
    /// cgroup's) memory left after the caches.
    #[arg(long, env = "VSERVE_MAX_INFLIGHT_BYTES", value_name = "SIZE")]
    pub max_inflight_bytes: Option<String>,
    /// Seconds calls in flight may take to finish after SIGTERM/SIGINT (a second signal stops at once).
    #[arg(long, env = "VSERVE_SHUTDOWN_GRACE", value_name = "SECONDS")]
    pub shutdown_grace: Option<f64>,
    /// Directory for shared-memory batch arenas (a tmpfs).
    #[arg(long, env = "VSERVE_SHM_DIR", value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
    /// Directory for what the daemon remembers across restarts (frame tables, dataset health, the
    /// poison-file journal), or `none`. Default: $STATE_DIRECTORY, else $XDG_STATE_HOME/vserve, else
    /// /var/lib/vserve for root, else ~/.local/state/vserve.
    #[arg(long, env = "VSERVE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Bound on the state directory's store of frame tables and health (least recently used go first).
    #[arg(long, env = "VSERVE_STORE_BYTES", value_name = "SIZE")]
    pub store_bytes: Option<String>,
    /// Seconds between listings of directory datasets (new and removed files) and re-reads of
    /// manifests; 0: at start, on SIGHUP and on `vserve reload` only (default 60).
    #[arg(long, env = "VSERVE_RESCAN_INTERVAL", value_name = "SECONDS")]
    pub rescan_interval: Option<f64>,
    /// Streaming calls one client (a process on the Unix socket, an address on TCP) may hold at once
    /// (default: half of --max-streams).
    #[arg(long, env = "VSERVE_CLIENT_STREAMS", value_name = "N")]
    pub client_streams: Option<usize>,
    /// Unary calls that do work (Probe, ListDatasets) in flight at once (default 64).
    #[arg(long, env = "VSERVE_MAX_UNARY", value_name = "N")]
    pub max_unary: Option<usize>,
    /// ... of them from one client (default 16).
    #[arg(long, env = "VSERVE_CLIENT_UNARY", value_name = "N")]
    pub client_unary: Option<usize>,
    /// Shared-memory bytes of all clients' arenas (default: 3/4 of the shm directory's filesystem).
    #[arg(long, env = "VSERVE_SHM_BYTES", value_name = "SIZE")]
    pub shm_bytes: Option<String>,
    /// Shared-memory bytes of one client's arenas (default: half of --shm-bytes).
    #[arg(long, env = "VSERVE_CLIENT_SHM_BYTES", value_name = "SIZE")]
    pub client_shm_bytes: Option<String>,
    /// In-flight bytes (--max-inflight-bytes) one client may hold (default: half of it).
    #[arg(long, env = "VSERVE_CLIENT_INFLIGHT_BYTES", value_name = "SIZE")]
    pub client_inflight_bytes: Option<String>,
    /// The last places of --max-streams, kept for clients holding fewer than their fair share
    /// (default: an eighth of --max-streams).
    #[arg(long, env = "VSERVE_RESERVED_STREAMS", value_name = "N")]
    pub reserved_streams: Option<usize>,
    /// The last bytes of --max-inflight-bytes, kept the same way (default: an eighth of it).
    #[arg(long, env = "VSERVE_RESERVED_INFLIGHT_BYTES", value_name = "SIZE")]
    pub reserved_inflight_bytes: Option<String>,
    /// Seconds a stream may go without its client taking a batch or releasing a slot, or a GetClips
    /// reply without its client reading a message, before it is ended with DEADLINE_EXCEEDED and its
    /// memory released (default 600; 0: never).
    #[arg(long, env = "VSERVE_STREAM_IDLE_TIMEOUT", value_name = "SECONDS")]
    pub stream_idle_timeout: Option<f64>,
    /// Serve a TCP listener on a non-loopback address without --auth-token-file (otherwise refused).
    /// `--allow-insecure-tcp=false` and the variable (true/false, 1/0, yes/no, on/off) override the file.
    #[arg(
        long,
        env = "VSERVE_ALLOW_INSECURE_TCP",
        value_name = "BOOL",
        value_parser = clap::builder::BoolishValueParser::new(),
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub allow_insecure_tcp: Option<bool>,
    /// Concurrent streaming calls (GetClips, StreamBatches); beyond it calls get RESOURCE_EXHAUSTED.
    #[arg(long, env = "VSERVE_MAX_STREAMS", value_name = "N")]
    pub max_streams: Option<usize>,
    /// Admin HTTP listener for /metrics, /livez, /readyz: HOST:PORT, or none (default 127.0.0.1:9464).
    #[arg(long, env = "VSERVE_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Log format on stderr: text or json (the level filter is VSERVE_LOG).
    #[arg(long, env = "VSERVE_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Permission bits of Unix socket files, in octal (default 0660).
    #[arg(long, env = "VSERVE_SOCKET_MODE", value_name = "MODE")]
    pub socket_mode: Option<String>,
    /// Group owning Unix socket files (name or gid).
    #[arg(long, env = "VSERVE_SOCKET_GROUP", value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// File with the bearer token every RPC on a TCP listener must carry.
    #[arg(long, env = "VSERVE_AUTH_TOKEN_FILE", value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// TLS certificate chain (PEM) for the TCP listeners; needs --tls-key.
    #[arg(long, env = "VSERVE_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for the TCP listeners; needs --tls-cert.
    #[arg(long, env = "VSERVE_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

/// The subset of settings a TOML file may hold, named as the flags.
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    listen: Option<Vec<String>>,
    dataset: Option<Vec<String>>,
    cache_bytes: Option<toml::Value>,
    cache_admit_fraction: Option<f64>,
    index_cache_bytes: Option<toml::Value>,
    decode_threads: Option<usize>,
    decode_queue: Option<usize>,
    decode_deadline: Option<f64>,
    index_deadline: Option<f64>,
    gpus: Option<toml::Value>,
    nvdec_sessions: Option<usize>,
    max_frames: Option<usize>,
    max_side: Option<u32>,
    max_output_bytes: Option<toml::Value>,
    max_inflight_bytes: Option<toml::Value>,
    max_prefetch: Option<usize>,
    shutdown_grace: Option<f64>,
    shm_dir: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    store_bytes: Option<toml::Value>,
    rescan_interval: Option<f64>,
    client_streams: Option<usize>,
    max_unary: Option<usize>,
    client_unary: Option<usize>,
    shm_bytes: Option<toml::Value>,
    client_shm_bytes: Option<toml::Value>,
    client_inflight_bytes: Option<toml::Value>,
    reserved_streams: Option<usize>,
    reserved_inflight_bytes: Option<toml::Value>,
    stream_idle_timeout: Option<f64>,
    allow_insecure_tcp: Option<bool>,
    max_streams: Option<usize>,
    admin_listen: Option<String>,
    log_format: Option<String>,
    socket_mode: Option<String>,
    socket_group: Option<toml::Value>,
    auth_token_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

fn size_value(key: &str, v: &toml::Value) -> Result<u64, ConfigError> {
    match v {
        toml::Value::Integer(i) if *i >= 0 => Ok(*i as u64),
        toml::Value::String(s) => parse_bytes(key, s),
        other => Err(ConfigError::new(key, other.to_string(), "expected a size")),
    }
}

impl ServeArgs {
    /// Merges flags/env with the config file and validates everything.
    pub fn to_config(&self) -> Result<Config, ConfigError> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError::new("config", path.display().to_string(), e.to_string())
                })?;
                toml::from_str::<FileConfig>(&text).map_err(|e| {
                    ConfigError::new("config", path.display().to_string(), e.to_string())
                })?
            }
            None => FileConfig::default(),
        };
        let listen_raw = if !self.listen.is_empty() {
            self.listen.clone()
        } else {
            match &file.listen {
                // Falling back to the default socket would serve somewhere the file does not say.
                Some(l) if l.is_empty() => {
                    return Err(ConfigError::new(
                        "listen",
                        "[]",
                        "an empty list; name at least one address, or leave `listen` out for the default socket",
                    ))
                }
                l => l.clone().unwrap_or_default(),
            }
        };
        let mut listen = listen_raw
            .iter()
            .map(|s| parse_listen(s))
            .collect::<Result<Vec<_>, _>>()?;
        if listen.is_empty() {
            listen.push(crate::config::ListenAddr::Unix(
                vserve_client::default_socket_path(),
            ));
        }
        // VSERVE_DATASET is split at commas, a flag is not ("d=/data/a,b" is one dataset): clap's
        // delimiter would split both.
        let env_datasets = std::env::var("VSERVE_DATASET")
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| v.split(',').map(str::to_owned).collect::<Vec<_>>());
        let dataset_raw = if !self.dataset.is_empty() {
            self.dataset.clone()
        } else if let Some(from_env) = env_datasets {
            from_env
        } else {
            file.dataset.clone().unwrap_or_default()
        };
        let datasets = dataset_raw
            .iter()
            .map(|s| parse_dataset(s))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, d) in datasets.iter().enumerate() {
            if datasets[..i].iter().any(|o| o.name == d.name) {
                return Err(ConfigError::new("dataset", &d.name, "name given twice"));
            }
        }
        // Sizes given (not the defaults) are checked against the host's memory.
        let fits = crate::config::check_fits_memory;
        let cache_bytes = match (&self.cache_bytes, &file.cache_bytes) {
            (Some(s), _) => fits("cache-bytes", parse_bytes("cache-bytes", s)?)?,
            (None, Some(v)) => fits("cache-bytes", size_value("cache-bytes", v)?)?,
            (None, None) => 2 << 30,
        };
        // Zero: no record would fit, every table and health result would fail to be stored.
        let store_bytes = at_least_one_byte(
            "store-bytes",
            match (&self.store_bytes, &file.store_bytes) {
                (Some(s), _) => parse_bytes("store-bytes", s)?,
                (None, Some(v)) => size_value("store-bytes", v)?,
                (None, None) => super::DEFAULT_STORE_BYTES,
            },
        )?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = self.decode_threads.or(file.decode_threads).unwrap_or(cores);
        if threads == 0 || threads > 1024 {
            return Err(ConfigError::new(
                "decode-threads",
                threads.to_string(),
                "must be 1..=1024",
            ));
        }
        let queue = self.decode_queue.or(file.decode_queue).unwrap_or(4096);
        if queue == 0 {
            return Err(ConfigError::new("decode-queue", "0", "must be at least 1"));
        }
        let gpus = match (&self.gpus, &file.gpus) {
            (Some(s), _) => parse_gpus(s)?,
            (None, Some(toml::Value::String(s))) => parse_gpus(s)?,
            (None, Some(toml::Value::Array(a))) => {
                let items: Vec<String> = a.iter().map(|v| v.to_string()).collect();
                parse_gpus(&items.join(","))?
            }
            (None, Some(toml::Value::Integer(i))) => parse_gpus(&i.to_string())?,
            (None, Some(other)) => {
                return Err(ConfigError::new(
                    "gpus",
                    other.to_string(),
                    "expected auto, none, all or a list of GPU ordinals",
                ))
            }
            (None, None) => crate::config::GpuSpec::Auto,
        };
        let nvdec_sessions = check_nvdec_sessions(
            self.nvdec_sessions
                .or(file.nvdec_sessions)
                .unwrap_or(DEFAULT_NVDEC_SESSIONS),
        )?;
        let defaults = Limits::default();
        // Zero: every request and stream batch would be refused.
        let max_output_bytes = at_least_one_byte(
            "max-output-bytes",
            match (&self.max_output_bytes, &file.max_output_bytes) {
                (Some(s), _) => parse_bytes("max-output-bytes", s)?,
                (None, Some(v)) => size_value("max-output-bytes", v)?,
                (None, None) => defaults.max_output_bytes,
            },
        )?;
        // Zero: no table would stay, every call would build its video's again.
        let index_bytes = at_least_one_byte(
            "index-cache-bytes",
            match (&self.index_cache_bytes, &file.index_cache_bytes) {
                (Some(s), _) => fits("index-cache-bytes", parse_bytes("index-cache-bytes", s)?)?,
                (None, Some(v)) => fits("index-cache-bytes", size_value("index-cache-bytes", v)?)?,
                (None, None) => 256 << 20,
            },
        )?;
        let max_inflight_bytes = at_least_one_byte(
            "max-inflight-bytes",
            match (&self.max_inflight_bytes, &file.max_inflight_bytes) {
                (Some(s), _) => parse_bytes("max-inflight-bytes", s)?,
                (None, Some(v)) => size_value("max-inflight-bytes", v)?,
                (None, None) => crate::config::default_inflight_bytes(cache_bytes, index_bytes),
            },
        )?;
        let limits = Limits {
            max_frames: self
                .max_frames
                .or(file.max_frames)
                .unwrap_or(defaults.max_frames),
            max_clips: defaults.max_clips,
            max_side: self.max_side.or(file.max_side).unwrap_or(defaults.max_side),
            max_output_bytes,
            max_prefetch: self
                .max_prefetch
                .or(file.max_prefetch)
                .unwrap_or(defaults.max_prefetch),
            max_streams: self
                .max_streams
                .or(file.max_streams)
                .unwrap_or(defaults.max_streams),
            max_inflight_bytes,
        };
        if limits.max_prefetch == 0 || limits.max_prefetch > 64 {
            return Err(ConfigError::new(
                "max-prefetch",
                limits.max_prefetch.to_string(),
                "must be 1..=64",
            ));
        }
        if limits.max_streams == 0 {
            return Err(ConfigError::new("max-streams", "0", "must be at least 1"));
        }
        if limits.max_frames == 0 {
            return Err(ConfigError::new("max-frames", "0", "must be at least 1"));
        }
        if limits.max_side == 0 {
            return Err(ConfigError::new("max-side", "0", "must be at least 1"));
        }
        let ops = self.ops_config(&file)?;
        let tenancy = self.tenancy(&file)?;
        // An open TCP port anyone on the network can reach serves every dataset: say so or refuse.
        for l in &listen {
            if let crate::config::ListenAddr::Tcp(sa) = l {
                if !sa.ip().is_loopback()
                    && ops.auth_token_file.is_none()
                    && !ops.allow_insecure_tcp
                {
                    return Err(ConfigError::new(
                        "listen",
                        sa.to_string(),
                        "a TCP listener on a non-loopback address needs --auth-token-file (or --allow-insecure-tcp to serve it without one)",
                    ));
                }
            }
        }
        let grace = self.shutdown_grace.or(file.shutdown_grace).unwrap_or(10.0);
        let grace = super::check_off_or_seconds("shutdown-grace", grace, 3600.0)?;
        // Default: /dev/shm, the tmpfs every Linux has; the temp dir where it is missing (some containers).
        let shm_dir = self.shm_dir.clone().or(file.shm_dir).unwrap_or_else(|| {
            let shm = PathBuf::from("/dev/shm");
            if shm.is_dir() {
                shm
            } else {
                std::env::temp_dir()
            }
        });
        if !shm_dir.is_dir() {
            return Err(ConfigError::new(
                "shm-dir",
                shm_dir.display().to_string(),
                "not a directory",
            ));
        }
        let state_dir = match self.state_dir.clone().or(file.state_dir) {
            Some(d) if d.as_os_str() == "none" => None,
            Some(d) => Some(d),
            None => super::default_state_dir(),
        };
        let rescan = self
            .rescan_interval
            .or(file.rescan_interval)
            .unwrap_or(60.0);
        let rescan = super::check_off_or_seconds("rescan-interval", rescan, 86_400.0)?;
        Ok(Config {
            rescan_interval: rescan,
            shm_dir,
            state_dir,
            tenancy,
            shutdown_grace: grace,
            listen,
            datasets,
            cache: CacheConfig {
                bytes: cache_bytes,
                index_bytes,
                store_bytes,
                admit_ppm: match self.cache_admit_fraction.or(file.cache_admit_fraction) {
                    Some(f) => super::parse_admit_fraction(f)?,
                    None => super::DEFAULT_ADMIT_PPM,
                },
            },
            decode: DecodeConfig {
                threads,
                threads_explicit: self.decode_threads.or(file.decode_threads).is_some(),
                queue,
                threads_per_decoder: 1,
                gpus,
                nvdec_sessions,
                deadline: crate::config::check_deadline(
                    "decode-deadline",
                    self.decode_deadline
                        .or(file.decode_deadline)
                        .unwrap_or(crate::config::DEFAULT_DECODE_DEADLINE_S),
                )?,
                index_deadline: crate::config::check_deadline(
                    "index-deadline",
                    self.index_deadline
                        .or(file.index_deadline)
                        .unwrap_or(crate::config::DEFAULT_INDEX_DEADLINE_S),
                )?,
            },
            limits,
            ops,
        })
    }

    /// The operating settings: admin listener, logs, socket access, token, TLS.
    fn ops_config(&self, file: &FileConfig) -> Result<OpsConfig, ConfigError> {
        let defaults = OpsConfig::default();
        let admin_listen = match self.admin_listen.as_ref().or(file.admin_listen.as_ref()) {
            Some(s) => parse_admin_listen(s)?,
            None => defaults.admin_listen,
        };
        let log_format = match self.log_format.as_ref().or(file.log_format.as_ref()) {
            Some(s) => parse_log_format(s)?,
            None => defaults.log_format,
        };
        let socket_mode = match self.socket_mode.as_ref().or(file.socket_mode.as_ref()) {
            Some(s) => parse_socket_mode(s)?,
            None => defaults.socket_mode,
        };
        let group_file = std::path::Path::new("/etc/group");
        let socket_group = match (&self.socket_group, &file.socket_group) {
            (Some(s), _) => Some(parse_socket_group(s, group_file)?),
            (None, Some(toml::Value::String(s))) => Some(parse_socket_group(s, group_file)?),
            (None, Some(toml::Value::Integer(i))) => Some(
                u32::try_from(*i)
                    .map_err(|_| ConfigError::new("socket-group", i.to_string(), "not a gid"))?,
            ),
            (None, Some(other)) => {
                return Err(ConfigError::new(
                    "socket-group",
                    other.to_string(),
                    "expected a group name or gid",
                ))
            }
            (None, None) => None,
        };
        let auth_token_file = self
            .auth_token_file
            .clone()
            .or_else(|| file.auth_token_file.clone());
        if let Some(path) = &auth_token_file {
            read_token("auth-token-file", path)?;
        }
        let cert = self.tls_cert.clone().or_else(|| file.tls_cert.clone());
        let key = self.tls_key.clone().or_else(|| file.tls_key.clone());
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => {
                check_readable("tls-cert", &cert)?;
                check_readable("tls-key", &key)?;
                Some(TlsFiles { cert, key })
            }
            (Some(cert), None) => {
                return Err(ConfigError::new(
                    "tls-key",
                    "(not set)",
                    format!("--tls-cert {} needs a key", cert.display()),
                ))
            }
            (None, Some(key)) => {
                return Err(ConfigError::new(
                    "tls-cert",
                    "(not set)",
                    format!("--tls-key {} needs a certificate", key.display()),
                ))
            }
            (None, None) => None,
        };
        Ok(OpsConfig {
            admin_listen,
            log_format,
            socket_mode,
            socket_group,
            auth_token_file,
            tls,
            allow_insecure_tcp: self
                .allow_insecure_tcp
                .or(file.allow_insecure_tcp)
                .unwrap_or(false),
        })
    }
}

/// The configuration as a TOML file would state it (`vserve config`).
pub fn config_to_toml(c: &Config) -> String {
    let list = |v: Vec<String>| {
        let quoted: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
        format!("[{}]", quoted.join(", "))
    };
    format!(
        "listen = {}\ndataset = {}\ncache-bytes = {}\nindex-cache-bytes = {}\ndecode-threads = {}\ndecode-queue = {}\ndecode-deadline = {}\nindex-deadline = {}\ngpus = {:?}\nnvdec-sessions = {}\nmax-frames = {}\nmax-side = {}\nmax-output-bytes = {}\nmax-inflight-bytes = {}\nmax-prefetch = {}\nshutdown-grace = {}\nshm-dir = {:?}\nstate-dir = {:?}\nstore-bytes = {}\n",
        list(c.listen.iter().map(|l| l.to_string()).collect()),
        list(
            c.datasets
                .iter()
                .map(|d| match &d.manifest {
                    Some(m) => format!("{}={}:manifest={}", d.name, d.root.display(), m.display()),
                    None => format!("{}={}", d.name, d.root.display()),
                })
                .collect()
        ),
        c.cache.bytes,
        c.cache.index_bytes,
        c.decode.threads,
        c.decode.queue,
        c.decode.deadline.as_secs_f64(),
        c.decode.index_deadline.as_secs_f64(),
        c.decode.gpus.to_string(),
        c.decode.nvdec_sessions,
        c.limits.max_frames,
        c.limits.max_side,
        c.limits.max_output_bytes,
        c.limits.max_inflight_bytes,
        c.limits.max_prefetch,
        c.shutdown_grace.as_secs_f64(),
        c.shm_dir.display().to_string(),
        c.state_dir
            .as_ref()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|| "none".into()),
        c.cache.store_bytes,
    ) + &format!(
        "cache-admit-fraction = {}\n",
        f64::from(c.cache.admit_ppm) / 1e6
    ) + &ops_to_toml(c)
}

/// The operating keys of `vserve config`; settings left unset are printed as comments.
fn ops_to_toml(c: &Config) -> String {
    let o = &c.ops;
    let path = |key: &str, p: Option<&std::path::Path>| match p {
        Some(p) => format!("{key} = {:?}\n", p.display().to_string()),
        None => format!("# {key} = (not set)\n"),
    };
    let mut out = format!("rescan-interval = {}\n", c.rescan_interval.as_secs_f64());
    out += &tenancy::tenancy_to_toml(&c.tenancy);
    out += &format!("allow-insecure-tcp = {}\n", o.allow_insecure_tcp);
    out += &format!(
        "max-streams = {}\nadmin-listen = {:?}\nlog-format = {:?}\nsocket-mode = \"{:04o}\"\n",
        c.limits.max_streams,
        o.admin_listen
            .map_or_else(|| "none".to_owned(), |a| a.to_string()),
        o.log_format.name(),
        o.socket_mode,
    );
    out += &match o.socket_group {
        Some(gid) => format!("socket-group = \"{gid}\"\n"),
        None => "# socket-group = (not set)\n".to_owned(),
    };
    out += &path("auth-token-file", o.auth_token_file.as_deref());
    out += &path("tls-cert", o.tls.as_ref().map(|t| t.cert.as_path()));
    out += &path("tls-key", o.tls.as_ref().map(|t| t.key.as_path()));
    out
}

/// `v`, or the error naming `key` when it is zero (a byte bound of 0 refuses or stores everything).
fn at_least_one_byte(key: &str, v: u64) -> Result<u64, ConfigError> {
    if v == 0 {
        return Err(ConfigError::new(key, "0", "must be at least 1 byte"));
    }
    Ok(v)
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
