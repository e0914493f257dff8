//! The Quarantine RPC: lists the crash quarantine ([`crate::journal::Quarantine`]) and clears entries
//! from it for a caller allowed to ([`may_administer`]: the daemon's own uid or root on the Unix socket,
//! or an in-process call; PERMISSION_DENIED otherwise). A path not in the quarantine is NOT_FOUND and
//! clears nothing; a cleared file is served again (the catalogue consults the same set).

use std::sync::Arc;

use tonic::Status;

use super::{fail_for, pb};
use crate::engine::Engine;
use crate::error::Error;
use crate::peer::Peer;

pub(super) async fn answer(
    engine: &Arc<Engine>,
    peer: &Peer,
    req: pb::QuarantineRequest,
) -> Result<pb::QuarantineResponse, Status> {
    let fail = |e| fail_for(engine, "Quarantine", Some(peer), e);
    let q = engine.catalog().quarantine().clone();
    let cleared = if req.all || !req.clear.is_empty() {
        if !may_administer(peer) {
            return Err(fail(Error::PermissionDenied(format!(
                "{} may not clear the quarantine: only the daemon's own user or root, on the Unix \
                 socket",
                peer.describe()
            ))));
        }
        let paths: Vec<std::path::PathBuf> = req.clear.iter().map(Into::into).collect();
        let cleared = tokio::task::spawn_blocking(move || q.clear(&paths, req.all))
            .await
            .map_err(|e| fail(Error::Internal(e.to_string())))?
            .map_err(|e| {
                fail(match e {
                    Ok(p) => Error::NotFound(format!(
                        "{:?} is not in the quarantine; nothing was cleared",
                        p.display().to_string()
                    )),
                    Err(io) => Error::Internal(format!(
                        "cannot write the quarantine; nothing was cleared: {io}"
                    )),
                })
            })?;
        for c in &cleared {
            tracing::info!(path = %c.key.path.display(), client = %peer.describe(), "cleared from the quarantine; it is served again");
        }
        cleared
    } else {
        Vec::new()
    };
    let q = engine.catalog().quarantine();
    // What is listed is what is refused: files changed since leave first.
    q.forget_changed();
    let entry = |e: crate::journal::Quarantined| pb::QuarantinedFile {
        path: e.key.path.display().to_string(),
        size: e.key.size,
        mtime_ns: i64::try_from(e.key.mtime_ns).unwrap_or(i64::MAX),
        since: e.since,
        reason: e.why,
    };
    Ok(pb::QuarantineResponse {
        files: q.list().into_iter().map(entry).collect(),
        cleared: cleared.into_iter().map(entry).collect(),
        location: q.location(),
    })
}

/// Whether `peer` may change the daemon's state for everyone (clear the quarantine): a process of the
/// daemon's own user or root on the Unix socket, or an in-process call; never a TCP client (its uid is
/// unknowable).
fn may_administer(peer: &Peer) -> bool {
    if peer.key == crate::peer::PeerKey::Local {
        return true;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    matches!(peer.uid, Some(uid) if uid == 0 || uid == me)
}
