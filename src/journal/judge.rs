//! What a dead process's journal records mean: who is quarantined, who becomes a suspect (the rules of
//! the journal's module comment).

use super::{FileKey, Quarantine, Quarantined};

/// Applies the module comment's rules to the records a dead process left (`inside`): who is
/// quarantined, who becomes a suspect. Whether anything changed.
pub(super) fn judge(quarantine: &Quarantine, inside: Vec<(u8, FileKey)>, now: u64) -> bool {
    let crashed = inside.iter().any(|(state, _)| *state == b'C');
    // One death counts once per file, however many threads were inside it (a popular file is often
    // decoded by several at once): the record that says most about the file speaks for it, a crash
    // (`C`) over a device run (`D`) over a plain busy record.
    let rank = |state: u8| match state {
        b'C' => 2,
        b'D' => 1,
        _ => 0,
    };
    let mut by_file: Vec<(u8, FileKey)> = Vec::with_capacity(inside.len());
    for (state, key) in inside {
        match by_file.iter_mut().find(|(_, k)| *k == key) {
            Some(seen) if rank(state) > rank(seen.0) => seen.0 = state,
            Some(_) => {}
            None => by_file.push((state, key)),
        }
    }
    let mut changed = false;
    for (state, key) in by_file {
        let path = key.path.display().to_string();
        let why = match state {
            b'C' => "the daemon crashed (a fault or an abort) inside this file",
            _ if crashed => {
                tracing::info!(%path, "another thread crashed the previous daemon while this file was open; not quarantined");
                continue;
            }
            b'D' => "the daemon, or the host, died while a GPU decoded this file",
            _ if quarantine.take_suspect(&key) => {
                "the daemon died inside this file twice (killed each time without a crash recorded: the OOM killer?)"
            }
            _ => {
                tracing::warn!(%path, "the previous daemon was killed while inside this file (no crash recorded): a suspect, quarantined if a daemon dies inside it again before a run of it finishes");
                quarantine.suspect(Quarantined {
                    key,
                    since: now,
                    why: String::new(),
                });
                changed = true;
                continue;
            }
        };
        tracing::warn!(%path, why, "quarantined: refused (DATA_LOSS) until it changes");
        quarantine.take_suspect(&key);
        quarantine.add(Quarantined {
            key,
            since: now,
            why: why.to_owned(),
        });
        changed = true;
    }
    changed
}
