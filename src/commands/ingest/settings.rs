//! The settings an output directory's frames were stored with (`vserve-ingest.json`), so that a resume
//! cannot mix them.

use std::path::Path;

use super::{io_err, write_atomic, IngestError, IngestOptions};

/// The file in an output directory that records the settings its frames were stored with.
pub const SETTINGS_FILE: &str = "vserve-ingest.json";

/// What decides the stored frames: a resume must use the same, or the dataset would mix sizes and rates
/// (it did, silently, and passed `gulp-check`).
fn settings_of(opts: &IngestOptions) -> serde_json::Value {
    serde_json::json!({
        "version": 1,
        "short_side": opts.short_side,
        "fps": opts.fps,
        "quality": opts.quality,
    })
}

/// Writes the settings file of a new output directory, or checks a resumed one's against `opts`.
/// `has_chunks`: the directory already holds complete chunks.
pub(super) fn settings_match(
    out: &Path,
    opts: &IngestOptions,
    has_chunks: bool,
) -> Result<(), IngestError> {
    let want = settings_of(opts);
    let path = out.join(SETTINGS_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let have: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| IngestError::Io {
                    path: path.display().to_string(),
                    reason: format!("unreadable ({e})"),
                })?;
            if have != want {
                return Err(IngestError::Usage(format!(
                    "{} was ingested with settings {have} and this run asks {want}: resume with the same --short-side, --fps and --quality, or write to another directory",
                    out.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if has_chunks {
                return Err(IngestError::Usage(format!(
                    "{} already holds chunks that no vserve ingest recorded ({SETTINGS_FILE} is missing): write to an empty directory",
                    out.display()
                )));
            }
            write_atomic(out, SETTINGS_FILE, want.to_string().as_bytes()).map_err(io_err(out))
        }
        Err(e) => Err(io_err(&path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(short_side: Option<u32>, fps: Option<f64>) -> IngestOptions {
        IngestOptions {
            dataset_dir: "/nonexistent".into(),
            manifest: None,
            out: "/nonexistent".into(),
            fps,
            short_side,
            quality: 90,
            videos_per_chunk: 2,
            jobs: 1,
            progress: false,
        }
    }

    #[test]
    fn no_jobs_is_a_usage_error_as_in_check_and_index() {
        let o = IngestOptions {
            jobs: 0,
            ..opts(None, None)
        };
        match super::super::run(&o) {
            Err(IngestError::Usage(m)) => assert!(m.contains("--jobs"), "{m}"),
            r => panic!("expected a usage error, got {r:?}"),
        }
    }

    /// A manifest whose integer labels include -1 gave label_index -1 ("no label") and a label2idx.json
    /// the gulp reader refuses: ingest refuses it before writing anything.
    #[test]
    fn a_manifest_with_a_negative_label_is_a_usage_error() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("m.csv");
        std::fs::write(&manifest, "path,label\na.mp4,0\nb.mp4,-1\n").unwrap();
        let out = dir.path().join("out");
        let o = IngestOptions {
            dataset_dir: dir.path().into(),
            manifest: Some(manifest),
            out: out.clone(),
            ..opts(None, None)
        };
        match super::super::run(&o) {
            Err(IngestError::Usage(m)) => assert!(
                m.starts_with(r#"label "-1" has label_index -1: indices must be >= 0"#),
                "{m}"
            ),
            r => panic!("expected a usage error, got {r:?}"),
        }
        assert!(!out.exists(), "nothing written");
    }

    #[test]
    fn a_resume_with_other_settings_or_into_a_foreign_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        // A new directory records its settings; the same settings resume, others are refused by name.
        settings_match(out, &opts(Some(64), None), false).unwrap();
        assert!(out.join(SETTINGS_FILE).is_file());
        settings_match(out, &opts(Some(64), None), true).unwrap();
        for other in [opts(Some(128), None), opts(Some(64), Some(5.0))] {
            match settings_match(out, &other, true) {
                Err(IngestError::Usage(m)) => assert!(m.contains("resume with the same"), "{m}"),
                r => panic!("expected a usage error, got {r:?}"),
            }
        }
        // Chunks without a settings file (another writer's, a broken leftover) are not resumed into.
        let foreign = tempfile::tempdir().unwrap();
        match settings_match(foreign.path(), &opts(None, None), true) {
            Err(IngestError::Usage(m)) => assert!(m.contains("no vserve ingest recorded"), "{m}"),
            r => panic!("expected a usage error, got {r:?}"),
        }
    }
}
