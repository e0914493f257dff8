//! The module graph stays acyclic: every top-level module of `src/` may name (as `crate::m`) only modules
//! listed before it in [`PIPELINE`], the order data flows through the daemon. Read from the sources, so
//! an import that points back up the pipeline fails here, naming the file, the line and the edge.

use std::path::Path;

/// Top-level modules of `src/`, upstream first.
const PIPELINE: &[&str] = &[
    "shutdown",
    "config",
    "state",
    "peer",
    "metrics",
    "refusal",
    "dataset",
    "journal",
    "manifest",
    "sample",
    "index",
    "store",
    "plan",
    "gulp",
    "decode",
    "check",
    "cache",
    "batch",
    "transport",
    "error",
    "budget",
    "request",
    "catalog",
    "frames",
    "engine",
    "handle",
    "api",
    "admission",
    "auth",
    "rpc",
    "admin",
    "server",
    "cli",
    "commands",
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The `crate::m` names in a file's code (comments and the `#[cfg(test)] mod tests` block excluded),
/// with their line numbers.
fn crate_refs(text: &str) -> Vec<(usize, String)> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            let name: String = rest[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((n + 1, name));
            }
            rest = &rest[i + 7..];
        }
        // `use crate::{a, b}` groups.
        if let Some(i) = line.find("crate::{") {
            for part in line[i + 8..].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                out.push((n + 1, name));
            }
        }
    }
    out
}

#[test]
fn modules_import_only_upstream() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let rank = |m: &str| PIPELINE.iter().position(|p| *p == m);
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(own) = rank(&module) else {
            bad.push(format!(
                "{}: module {module:?} is not in PIPELINE",
                rel.display()
            ));
            continue;
        };
        for (line, name) in crate_refs(&std::fs::read_to_string(f).unwrap()) {
            if name.is_empty() || name == module || name == "self" {
                continue;
            }
            match rank(&name) {
                Some(r) if r < own => {}
                Some(_) => bad.push(format!(
                    "{}:{line}: {module} imports {name}, which is not upstream of it",
                    rel.display()
                )),
                None if name.chars().next().is_some_and(|c| c.is_ascii_uppercase()) => {}
                None => bad.push(format!(
                    "{}:{line}: unknown module crate::{name}",
                    rel.display()
                )),
            }
        }
    }
    assert!(
        bad.is_empty(),
        "import edges against the pipeline:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_sees_a_backward_edge() {
    let refs = crate_refs("use crate::{engine, index};\nfn f() { crate::api::x(); } // crate::server\n#[cfg(test)]\nmod tests { use crate::cli; }");
    let names: Vec<&str> = refs.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["engine", "index", "api"]);
}

#[test]
fn no_source_file_is_a_hub() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut big: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 700).then(|| format!("{} ({n} lines)", f.strip_prefix(&src).unwrap().display()))
        })
        .collect();
    big.sort();
    assert!(big.is_empty(), "source files over 700 lines: {big:?}");
}
