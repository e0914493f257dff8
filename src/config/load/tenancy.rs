//! The tenancy settings of `serve` ([`Tenancy`]: what one client may hold, what is kept for light
//! clients, shared memory, idle streams): merged from flags and the TOML file, checked, and printed back
//! for `vserve config`. A child of `load` so it reads the private [`FileConfig`].

use super::{parse_bytes, size_value, ConfigError, FileConfig, ServeArgs, Tenancy};

impl ServeArgs {
    pub(super) fn tenancy(&self, file: &FileConfig) -> Result<Tenancy, ConfigError> {
        let defaults = Tenancy::default();
        let size =
            |key: &str, flag: &Option<String>, value: &Option<toml::Value>| match (flag, value) {
                (Some(s), _) => parse_bytes(key, s).map(Some),
                (None, Some(v)) => size_value(key, v).map(Some),
                (None, None) => Ok(None),
            };
        let at_least_one = |key: &str, n: Option<usize>| match n {
            Some(0) => Err(ConfigError::new(key, "0", "must be at least 1")),
            n => Ok(n),
        };
        let idle = self
            .stream_idle_timeout
            .or(file.stream_idle_timeout)
            .unwrap_or(defaults.stream_idle.as_secs_f64());
        let idle = crate::config::check_off_or_seconds("stream-idle-timeout", idle, 86_400.0)?;
        let shm_bytes = size("shm-bytes", &self.shm_bytes, &file.shm_bytes)?;
        let client_shm_bytes = size(
            "client-shm-bytes",
            &self.client_shm_bytes,
            &file.client_shm_bytes,
        )?;
        if shm_bytes == Some(0) || client_shm_bytes == Some(0) {
            return Err(ConfigError::new("shm-bytes", "0", "must be at least 1"));
        }
        let client_inflight_bytes = size(
            "client-inflight-bytes",
            &self.client_inflight_bytes,
            &file.client_inflight_bytes,
        )?;
        if client_inflight_bytes == Some(0) {
            return Err(ConfigError::new(
                "client-inflight-bytes",
                "0",
                "must be at least 1",
            ));
        }
        Ok(Tenancy {
            client_streams: at_least_one(
                "client-streams",
                self.client_streams.or(file.client_streams),
            )?,
            max_unary: at_least_one("max-unary", self.max_unary.or(file.max_unary))?
                .unwrap_or(defaults.max_unary),
            client_unary: at_least_one("client-unary", self.client_unary.or(file.client_unary))?
                .unwrap_or(defaults.client_unary),
            shm_bytes,
            client_shm_bytes,
            client_inflight_bytes,
            reserved_streams: self.reserved_streams.or(file.reserved_streams),
            reserved_inflight_bytes: size(
                "reserved-inflight-bytes",
                &self.reserved_inflight_bytes,
                &file.reserved_inflight_bytes,
            )?,
            stream_idle: idle,
        })
    }
}

/// The tenancy keys of `vserve config`; derived settings are printed as comments.
pub(super) fn tenancy_to_toml(t: &Tenancy) -> String {
    let mut out = match t.client_streams {
        Some(n) => format!("client-streams = {n}\n"),
        None => "# client-streams = (half of max-streams)\n".to_owned(),
    };
    out += &match t.reserved_streams {
        Some(n) => format!("reserved-streams = {n}\n"),
        None => "# reserved-streams = (an eighth of max-streams)\n".to_owned(),
    };
    out += &format!(
        "max-unary = {}\nclient-unary = {}\nstream-idle-timeout = {}\n",
        t.max_unary,
        t.client_unary,
        t.stream_idle.as_secs_f64(),
    );
    for (key, v, derived) in [
        (
            "shm-bytes",
            t.shm_bytes,
            "derived from the shm directory's size",
        ),
        ("client-shm-bytes", t.client_shm_bytes, "half of shm-bytes"),
        (
            "client-inflight-bytes",
            t.client_inflight_bytes,
            "half of max-inflight-bytes",
        ),
        (
            "reserved-inflight-bytes",
            t.reserved_inflight_bytes,
            "an eighth of max-inflight-bytes",
        ),
    ] {
        out += &match v {
            Some(b) => format!("{key} = {b}\n"),
            None => format!("# {key} = ({derived})\n"),
        };
    }
    out
}
