//! `vserve quarantine list|clear`: the crash quarantine ([`crate::journal::Quarantine`]) of a running
//! daemon through the Quarantine RPC, or (`list --state-dir`) the one persisted in a state directory,
//! read without a daemon.
//!
//! Output: one line per file (`path  size=.. mtime_ns=.. quarantined=<epoch s>  why`), or with `--json`
//! one object `{"location", "files": [...], "cleared": [...]}`. Failures return the client error (gRPC
//! status name first) for `main` to print and exit 1; a state directory that cannot be read exits 66.

use serde_json::json;
use vserve_client::proto;

use crate::cli::QuarantineCommand;
use crate::journal::Quarantine;

fn entry_json(f: &proto::QuarantinedFile) -> serde_json::Value {
    json!({"path": f.path, "size": f.size, "mtime_ns": f.mtime_ns, "since": f.since, "reason": f.reason})
}

fn print(r: &proto::QuarantineResponse, json: bool, clearing: bool) {
    if json {
        let files: Vec<_> = r.files.iter().map(entry_json).collect();
        let cleared: Vec<_> = r.cleared.iter().map(entry_json).collect();
        println!(
            "{}",
            json!({"location": r.location, "files": files, "cleared": cleared})
        );
        return;
    }
    for f in &r.cleared {
        println!("cleared {}", f.path);
    }
    if !clearing || !r.files.is_empty() {
        println!("{} file(s) in quarantine ({})", r.files.len(), r.location);
    }
    for f in &r.files {
        println!(
            "{}  size={} mtime_ns={} quarantined={}  {}",
            f.path, f.size, f.mtime_ns, f.since, f.reason
        );
    }
}

/// The quarantine persisted in a state directory, as the RPC would list it. A directory that does not
/// exist, or whose quarantine cannot be read, is this side's input failing (66), not a daemon's status.
fn offline(dir: &std::path::Path) -> Result<proto::QuarantineResponse, super::CommandError> {
    let q = Quarantine::read_persisted(dir)
        .map_err(|e| {
            super::CommandError::NoInput(format!(
                "cannot read the state directory {}: {e}",
                dir.display()
            ))
        })?
        .ok_or_else(|| {
            super::CommandError::NoInput(format!("no state directory {}", dir.display()))
        })?;
    Ok(proto::QuarantineResponse {
        files: q
            .list()
            .into_iter()
            // Without the daemon nothing is written: changed files are only left out of the listing.
            .filter(crate::journal::unchanged)
            .map(|e| proto::QuarantinedFile {
                path: e.key.path.display().to_string(),
                size: e.key.size,
                mtime_ns: i64::try_from(e.key.mtime_ns).unwrap_or(i64::MAX),
                since: e.since,
                reason: e.why,
            })
            .collect(),
        cleared: Vec::new(),
        location: q.location(),
    })
}

pub async fn run(cmd: &QuarantineCommand) -> Result<(), super::CommandError> {
    match cmd {
        QuarantineCommand::List(a) => {
            let r = match &a.state_dir {
                Some(dir) => offline(dir)?,
                None => {
                    super::connect(&a.addr)
                        .await?
                        .quarantine(Vec::new(), false)
                        .await?
                }
            };
            print(&r, a.json, false);
        }
        QuarantineCommand::Clear(a) => {
            let r = super::connect(&a.addr)
                .await?
                .quarantine(a.path.clone(), a.all)
                .await?;
            print(&r, a.json, true);
        }
    }
    Ok(())
}
