//! The client's deadline: gRPC's `grpc-timeout` request header, parsed as gRPC over HTTP/2 writes it.

/// The `grpc-timeout` header's duration (gRPC over HTTP/2: at most 8 digits and a unit, H M S m u n):
/// `Ok(None)` when absent, `Err` with the header's text (quoted: at most 40 characters) when
/// malformed.
pub(super) fn grpc_timeout(
    headers: &http::HeaderMap,
) -> Result<Option<std::time::Duration>, String> {
    use std::time::Duration;
    let Some(value) = headers.get("grpc-timeout") else {
        return Ok(None);
    };
    let bad = || crate::refusal::quoted(&String::from_utf8_lossy(value.as_bytes()), 40);
    let text = value.to_str().map_err(|_| bad())?;
    let Some(digits) = text.len().checked_sub(1).and_then(|n| text.get(..n)) else {
        return Err(bad());
    };
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    Ok(Some(match &text[digits.len()..] {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return Err(bad()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_headers_parse_as_the_spec_writes_them() {
        use std::time::Duration;
        let parse = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&h).unwrap()
        };
        assert_eq!(parse("5m"), Some(Duration::from_millis(5)));
        assert_eq!(parse("99999999S"), Some(Duration::from_secs(99_999_999)));
        assert_eq!(parse("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse("9n"), Some(Duration::from_nanos(9)));
        for bad in [
            "",
            "m",
            "5",
            "5x",
            "123456789m",
            "-5m",
            "+5m",
            "5 m",
            "abc",
            "-1S",
        ] {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", http::HeaderValue::from_str(bad).unwrap());
            assert_eq!(grpc_timeout(&h), Err(bad.to_string()), "{bad:?}");
        }
        let mut h = http::HeaderMap::new();
        h.insert(
            "grpc-timeout",
            http::HeaderValue::from_bytes(b"5\xff").unwrap(),
        );
        assert_eq!(grpc_timeout(&h), Err("5\u{fffd}".to_string()));
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), Ok(None));
    }
}
