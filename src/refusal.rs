//! The refusal log: calls refused for load (RESOURCE_EXHAUSTED) are logged at WARN at most once per
//! interval for each (client, reason), so a client retrying against a full limit thousands of times a
//! minute costs a line every few seconds, not a line per try. Errors a client caused (INVALID_ARGUMENT,
//! NOT_FOUND, OUT_OF_RANGE, PERMISSION_DENIED) are thinned the same way per (client, code): the key's
//! reason is then the code's name, which no limit name equals. The metrics still count every refusal
//! (`vserve_rpc_requests_total{code=...}`); only the log is thinned.
//!
//! Input: a refusal's client (as [`crate::peer::Peer::describe`] names it) and message. Output: whether
//! to log it now, and how many refusals of the same key were left out since the last line logged
//! (`suppressed`, carried by that line). The first refusal of a key is always logged.
//!
//! Invariants: per key, lines logged ≤ 1 + elapsed / interval; no refusal is lost from the counts carried
//! by later lines of its key unless its key is dropped from the table, which happens only to keys
//! quiet for a whole interval (or, past [`MAX_KEYS`] keys, to all of them at once: a bounded table
//! whatever the number of clients).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How often one (client, reason) may log a refusal.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Keys the table holds at most.
pub const MAX_KEYS: usize = 4096;

/// The limits a refusal may name, the most specific first (`client-shm-bytes` before `shm-bytes`).
const REASONS: &[&str] = &[
    "client-inflight-bytes",
    "reserved-inflight-bytes",
    "max-inflight-bytes",
    "client-shm-bytes",
    "shm-bytes",
    "client-streams",
    "reserved-streams",
    "max-streams",
    "client-unary",
    "max-unary",
    "max-output-bytes",
    "decode-queue",
];

/// The limit a refusal's message names (its key's reason), or `other`.
pub fn reason(message: &str) -> &'static str {
    REASONS
        .iter()
        .find(|r| message.contains(&format!("{r})")))
        .copied()
        .unwrap_or("other")
}

#[derive(Debug)]
struct Entry {
    logged: Instant,
    suppressed: u64,
}

/// The rate limiter of refusal lines. One per process ([`RefusalLog::global`]); tests make their own.
#[derive(Debug)]
pub struct RefusalLog {
    interval: Duration,
    keys: Mutex<HashMap<(String, &'static str), Entry>>,
}

impl RefusalLog {
    pub fn new(interval: Duration) -> RefusalLog {
        RefusalLog {
            interval,
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// The daemon's log, with [`DEFAULT_INTERVAL`].
    pub fn global() -> &'static RefusalLog {
        static LOG: OnceLock<RefusalLog> = OnceLock::new();
        LOG.get_or_init(|| RefusalLog::new(DEFAULT_INTERVAL))
    }

    /// A log of conditions that are no call's refusal but could repeat thousands of times a minute
    /// (connections closed for a client over its bound, failed accepts, files the crash journal cannot
    /// record): a line a minute per key, with the count left out.
    pub fn minutely() -> &'static RefusalLog {
        static LOG: OnceLock<RefusalLog> = OnceLock::new();
        LOG.get_or_init(|| RefusalLog::new(Duration::from_secs(60)))
    }

    /// One refusal of `client` for `reason` at `now`: `Some(suppressed)` when a line is due (with the
    /// refusals of the key left out since its last line), `None` when this one is left out.
    pub fn note_at(&self, client: &str, reason: &'static str, now: Instant) -> Option<u64> {
        let mut keys = self.keys.lock();
        let key = (client.to_owned(), reason);
        if let Some(e) = keys.get_mut(&key) {
            if now.saturating_duration_since(e.logged) < self.interval {
                e.suppressed += 1;
                return None;
            }
            let suppressed = std::mem::take(&mut e.suppressed);
            e.logged = now;
            return Some(suppressed);
        }
        if keys.len() >= MAX_KEYS {
            let interval = self.interval;
            keys.retain(|_, e| now.saturating_duration_since(e.logged) < interval);
            if keys.len() >= MAX_KEYS {
                keys.clear();
            }
        }
        keys.insert(
            key,
            Entry {
                logged: now,
                suppressed: 0,
            },
        );
        Some(0)
    }

    /// Logs a refusal of `method` for `client` at WARN if its key is due.
    pub fn log(&self, method: &'static str, client: &str, message: &str) {
        let reason = reason(message);
        if let Some(suppressed) = self.note_at(client, reason, Instant::now()) {
            let message = &*printable(message);
            tracing::warn!(
                method,
                client,
                reason,
                suppressed,
                message,
                "request refused"
            );
        }
    }

    /// Logs an error a client caused (`code`: INVALID_ARGUMENT, NOT_FOUND, ...) of `method` for
    /// `client` at WARN if its (client, code) key is due: a client sending bad requests in a loop costs
    /// a line per interval, carrying how many were left out.
    pub fn log_client_error(
        &self,
        method: &'static str,
        client: &str,
        code: &'static str,
        message: &str,
    ) {
        self.log_keyed(method, client, client, code, message);
    }

    /// Logs a failure of a file `client` asked for (DATA_LOSS and the like) at WARN if its (client,
    /// message) key is due: a loader retrying one corrupt file in a loop costs a line per interval,
    /// and every other file or failure still gets its own first line.
    pub fn log_failure(
        &self,
        method: &'static str,
        client: &str,
        code: &'static str,
        message: &str,
    ) {
        self.log_keyed(
            method,
            client,
            &format!("{client} {message}"),
            code,
            message,
        );
    }

    fn log_keyed(
        &self,
        method: &'static str,
        client: &str,
        key: &str,
        code: &'static str,
        message: &str,
    ) {
        if let Some(suppressed) = self.note_at(key, code, Instant::now()) {
            let message = &*printable(message);
            tracing::warn!(method, client, code, suppressed, message, "request refused");
        }
    }

    /// Keys in the table now.
    pub fn keys(&self) -> usize {
        self.keys.lock().len()
    }
}

/// `text` with its control characters (line breaks, NUL, escapes) written as Rust escapes: a message
/// quotes what a client sent, and must not be able to start a log line of its own.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// `text` cut to its first `chars` characters (marked, with its length in bytes, when cut) and made
/// [`printable`]: a quote, in a message or a log line, of something a client or a file system gave
/// (a request path, a header, a 4 KiB directory path).
pub fn quoted(text: &str, chars: usize) -> String {
    let cut = match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}... ({} bytes)", &text[..at], text.len()),
        None => text.to_owned(),
    };
    printable(&cut).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_cut_and_printable() {
        assert_eq!(quoted("short\n", 10), "short\\n");
        assert_eq!(quoted("abcdef", 3), "abc... (6 bytes)");
    }

    #[test]
    fn messages_cannot_forge_log_lines() {
        assert_eq!(printable("a/b.mp4 is missing"), "a/b.mp4 is missing");
        assert_eq!(
            printable("/x\n2026-11-27 ERROR forged\0\u{1b}[31m"),
            "/x\\n2026-11-27 ERROR forged\\u{0}\\u{1b}[31m"
        );
    }

    #[test]
    fn the_first_refusal_is_logged_then_one_line_per_interval_with_the_count() {
        let log = RefusalLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        assert_eq!(log.note_at("pid 7", "max-streams", at(0.0)), Some(0));
        // 500 more within the interval: none logged.
        for i in 0..500 {
            assert_eq!(
                log.note_at("pid 7", "max-streams", at(i as f64 * 0.019)),
                None
            );
        }
        // Another reason of the same client, and the same reason of another client, have their own keys.
        assert_eq!(log.note_at("pid 7", "client-streams", at(1.0)), Some(0));
        assert_eq!(log.note_at("pid 8", "max-streams", at(1.0)), Some(0));
        // After the interval: one line carrying the 500 left out, then quiet again.
        assert_eq!(log.note_at("pid 7", "max-streams", at(10.0)), Some(500));
        assert_eq!(log.note_at("pid 7", "max-streams", at(15.0)), None);
        assert_eq!(log.note_at("pid 7", "max-streams", at(20.5)), Some(1));
        assert_eq!(log.keys(), 3);
    }

    #[test]
    fn client_errors_are_thinned_per_client_and_code_beside_refusals() {
        let log = RefusalLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        assert_eq!(
            log.note_at("10.0.0.1", "INVALID_ARGUMENT", at(0.0)),
            Some(0)
        );
        for i in 0..99 {
            assert_eq!(
                log.note_at("10.0.0.1", "INVALID_ARGUMENT", at(i as f64 * 0.05)),
                None
            );
        }
        // Another code, a load refusal of the same client, and another client: keys of their own.
        assert_eq!(log.note_at("10.0.0.1", "NOT_FOUND", at(1.0)), Some(0));
        assert_eq!(log.note_at("10.0.0.1", "max-streams", at(1.0)), Some(0));
        assert_eq!(
            log.note_at("10.0.0.2", "INVALID_ARGUMENT", at(1.0)),
            Some(0)
        );
        assert_eq!(
            log.note_at("10.0.0.1", "INVALID_ARGUMENT", at(10.0)),
            Some(99)
        );
        assert_eq!(log.keys(), 4);
        // A code name is never taken for a limit a RESOURCE_EXHAUSTED message names.
        assert!(REASONS
            .iter()
            .all(|r| !r.chars().any(|c| c.is_ascii_uppercase())));
        // The logging entry point goes through the same table.
        log.log_client_error("Probe", "10.0.0.3", "OUT_OF_RANGE", "frame 9 of 4");
        log.log_client_error("Probe", "10.0.0.3", "OUT_OF_RANGE", "frame 9 of 4");
        assert_eq!(log.note_at("10.0.0.3", "OUT_OF_RANGE", at(0.5)), None);
        assert_eq!(log.keys(), 5);
    }

    #[test]
    fn the_table_stays_bounded_whatever_the_clients() {
        let log = RefusalLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..MAX_KEYS {
            log.note_at(&format!("10.0.{}.{}", i / 256, i % 256), "max-streams", t0);
        }
        assert_eq!(log.keys(), MAX_KEYS);
        // Past the bound, keys quiet for an interval go; here all are recent, so the table starts over.
        assert_eq!(log.note_at("new", "max-streams", t0), Some(0));
        assert_eq!(log.keys(), 1);
        // Quiet keys are dropped first when there are some.
        let later = t0 + Duration::from_secs(11);
        for i in 0..MAX_KEYS - 1 {
            log.note_at(&format!("b{i}"), "max-streams", later);
        }
        assert_eq!(log.keys(), MAX_KEYS);
        log.note_at("newest", "max-streams", later);
        assert_eq!(log.keys(), MAX_KEYS, "only the quiet key went");
    }

    #[test]
    fn reasons_are_the_limits_messages_name() {
        assert_eq!(
            reason("pid 4 (uid 1) has 32 streams in flight, the limit per client (client-streams); retry"),
            "client-streams"
        );
        assert_eq!(
            reason("GetClips needs 1 bytes (1 B), 100 of 100 in use (max-inflight-bytes)"),
            "max-inflight-bytes"
        );
        assert_eq!(
            reason("arena of 5 bytes: 9 of 10 in use by this client (client-shm-bytes)"),
            "client-shm-bytes"
        );
        assert_eq!(reason("something else"), "other");
    }
}
