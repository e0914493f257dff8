//! Access control for TCP listeners: a bearer token every call must carry
//! (`authorization: Bearer <token>`), checked by a tonic interceptor before the service sees the call.
//!
//! Input: the token read from `--auth-token-file` at start-up; each call's metadata. Output: the call, or
//! UNAUTHENTICATED. The health service is left open (probes carry no secrets); Unix sockets are guarded by
//! their file mode and group instead.

use std::sync::Arc;

use tonic::{Request, Status};

/// Checks the bearer token of each call. Cheap to clone.
#[derive(Clone)]
pub struct TokenCheck {
    expected: Arc<[u8]>,
}

impl std::fmt::Debug for TokenCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.write_str("TokenCheck(..)")
    }
}

impl TokenCheck {
    pub fn new(token: &str) -> TokenCheck {
        TokenCheck {
            expected: Arc::from(token.as_bytes()),
        }
    }

    fn check(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        let Some(value) = metadata.get("authorization") else {
            return Err(Status::unauthenticated(
                "missing bearer token (authorization metadata)",
            ));
        };
        // The scheme's name is case-insensitive (RFC 9110 11.1): `bearer` and `BEARER` count too.
        let bytes = value.as_bytes();
        let given = bytes
            .get(..7)
            .filter(|scheme| scheme.eq_ignore_ascii_case(b"Bearer "))
            .map(|_| &bytes[7..])
            .ok_or_else(|| Status::unauthenticated("authorization is not a bearer token"))?;
        if constant_time_eq(given, &self.expected) {
            Ok(())
        } else {
            Err(Status::unauthenticated("wrong bearer token"))
        }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match self.check(request.metadata()) {
            Ok(()) => Ok(request),
            Err(status) => {
                // Thinned per client like every refusal a client causes (a line per interval with the
                // count left out): anyone who can reach the port could otherwise grow the log at will.
                // The RPC layer has put the connection's peer in the extensions.
                let client = request
                    .extensions()
                    .get::<crate::peer::Peer>()
                    .map_or_else(|| "unknown".to_owned(), |p| p.describe());
                crate::refusal::RefusalLog::global().log_client_error(
                    "(authentication)",
                    &client,
                    "UNAUTHENTICATED",
                    status.message(),
                );
                Err(status)
            }
        }
    }
}

/// Compares without an early exit on the first differing byte, so timing does not reveal the prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    fn with_auth(value: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(v) = value {
            r.metadata_mut().insert("authorization", v.parse().unwrap());
        }
        r
    }

    #[test]
    fn accepts_only_the_configured_bearer_token() {
        let mut check = TokenCheck::new("s3cret");
        for good in ["Bearer s3cret", "bearer s3cret", "BEARER s3cret"] {
            assert!(check.call(with_auth(Some(good))).is_ok(), "{good}");
        }
        for bad in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("s3cret"),
            Some("Basic s3cret"),
            Some("bearer S3CRET"),
        ] {
            let e = check.call(with_auth(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
        assert!(!format!("{check:?}").contains("s3cret"));
    }
}
