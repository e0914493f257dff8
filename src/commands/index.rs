//! `vserve index`: build the frame tables of a dataset (or shard `I/N` of it) into the store of
//! `--state-dir` ahead of training, so that the daemon serving it later builds none
//! ([`crate::check::index_one`], the catalogue's own table build). A file whose record the store already
//! holds for its current size and mtime is skipped without being opened: a second run, or one over a
//! store merged from other shards, only indexes what is new or changed.
//!
//! Output: one line per video on stdout as it finishes (a table, or JSON objects with `--json`:
//! `video`, `status` indexed|stored|unwritten|unreadable|quarantined, `frames`, `decodable_frames`,
//! `first_bad_frame` (a table that met decoder errors), `reason`, `seconds`), then a summary; a progress
//! bar on stderr when it is a terminal. Exit: 0 every video has a table, 1 some cannot be indexed, 64
//! bad flags, 74 an unusable state directory or a table that could not be written to it.

use std::process::ExitCode;

use super::check::{Local, Output, USAGE};
use crate::check::{Shard, Summary, VideoReport, INDEXED, STORED, UNWRITTEN};
use crate::cli::IndexArgs;

fn has_table(r: &VideoReport) -> bool {
    r.status == INDEXED || r.status == STORED
}

/// Runs `vserve index`.
pub fn run(args: &IndexArgs) -> ExitCode {
    let usage = |msg: String| {
        eprintln!("vserve index: {msg}");
        ExitCode::from(USAGE)
    };
    let shard = match args.shard.as_deref().map(Shard::parse).transpose() {
        Ok(s) => s.unwrap_or(Shard::ALL),
        Err(e) => return usage(e),
    };
    if args.jobs == Some(0) {
        return usage("--jobs must be at least 1".into());
    }
    let local = match Local::open(
        "index",
        &args.dataset,
        shard,
        args.state_dir.as_deref(),
        args.store_bytes.as_deref(),
    ) {
        Ok(l) => l,
        Err(code) => return code,
    };
    if local.store.is_none() {
        return usage("a state directory is needed to keep the tables in (--state-dir)".into());
    }
    let mut out = Output::new(args.json, "index", has_table);
    let mut summary = Summary {
        by_status: [INDEXED, STORED, UNWRITTEN, "unreadable", "quarantined"]
            .iter()
            .map(|s| (s.to_string(), 0, 0.0))
            .collect(),
    };
    out.begin(local.videos.len());
    crate::check::run_each(
        &local.ds,
        &local.videos,
        local.jobs(args.jobs),
        local.store.as_ref(),
        |d, v, s| Some(crate::check::index_one(d, v, s)),
        |r, _, done, _| {
            summary.add(&r);
            out.video(&r, done);
            true
        },
    );
    out.summary(&summary);
    if let Some(why) = crate::check::UNSTORED.report() {
        eprintln!("vserve index: {why}");
        return ExitCode::from(super::check::IO);
    }
    // Tables written and then deleted to keep within --store-bytes are tables the daemon builds again:
    // the run said "indexed" and exited 0 with 218 of 600 records left (probe E).
    if let Some(store) = local.store.as_ref().filter(|s| s.evicted() > 0) {
        let (records, bytes) = store.held();
        let wanted = summary
            .by_status
            .iter()
            .filter(|(s, _, _)| s == INDEXED || s == STORED)
            .map(|(_, files, _)| *files)
            .sum::<u64>();
        let per = (bytes / records.max(1)).max(4096);
        eprintln!(
            "vserve index: the store is too small for this dataset's tables: {} records were deleted to \
             keep within --store-bytes ({records} held, {}); the daemon would build those again. Give \
             --store-bytes at least {} (the daemon's too) and run again",
            store.evicted(),
            crate::budget::human_bytes(bytes),
            crate::budget::human_bytes(wanted * per * 10 / 9 + (1 << 20))
        );
        return ExitCode::from(super::check::IO);
    }
    let failed = summary
        .by_status
        .iter()
        .any(|(s, files, _)| *files > 0 && s != INDEXED && s != STORED);
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
