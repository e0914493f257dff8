//! `tables`: what holding frame tables costs in memory, as the index cache holds them: tables built by a
//! scan as vectors (the representation before tables were packed), packed (a store record's columns read
//! in place on the heap, what the catalogue now caches), and read back from a store (records under 16 KiB
//! on the heap, longer ones memory-mapped). Also the cost of reading frame k from each.
//!
//! ```text
//! cargo bench --bench tables -- [N]      # N tables (default 10000), each mode in a fresh child process
//! ```
//!
//! The tables are those of the media corpus's videos (../shared/media), cycled to N. Each mode runs in its
//! own process: RSS (VmRSS) is read before and after building N tables, so allocator reuse between modes
//! cannot flatter one. Prints one JSON object: bytes of RSS per table by mode, and the ratios.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use vserve::index::VideoIndex;
use vserve::store::{format, Health, Key, Record, Store};

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn corpus() -> Vec<VideoIndex> {
    let root = PathBuf::from("../shared/media");
    let mut out = Vec::new();
    for p in vserve::dataset::walk_videos(&root) {
        if let Ok(ix) = vserve::decode::ffmpeg::build_index(&p, None, false) {
            out.push(ix);
        }
    }
    out
}

fn child(mode: &str, n: usize) {
    let tables = corpus();
    assert!(!tables.is_empty(), "no video under ../shared/media");
    let frames: usize = (0..n).map(|i| tables[i % tables.len()].frame_count()).sum();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(
        &vserve::state::StateDir::open(dir.path()).expect("state dir"),
        u64::MAX,
    );
    let key = |i: usize| Key {
        path: PathBuf::from(format!("/videos/{i:07}.mp4")),
        size: i as u64,
        mtime_ns: 1,
        stream: None,
    };
    if mode == "store" {
        for i in 0..n {
            let r = Record {
                key: key(i),
                health: Health::Unchecked,
                decode_table: false,
                table: Some(Arc::new(tables[i % tables.len()].clone())),
                written_ms: 0,
                content: 0,
                node: Default::default(),
            };
            store.put(&r).expect("store write");
        }
    }
    let before = rss();
    let mut held: Vec<Arc<VideoIndex>> = Vec::with_capacity(n);
    for i in 0..n {
        let t = &tables[i % tables.len()];
        held.push(match mode {
            "vectors" => Arc::new(t.clone()),
            "packed" => Arc::new(format::pack(t.clone())),
            _ => store
                .get(&key(i))
                .and_then(|r| r.table)
                .expect("stored table"),
        });
    }
    let after = rss();
    // Read every frame of every table once (the access path a request takes).
    let t0 = Instant::now();
    let mut sum = 0i64;
    for t in &held {
        for k in 0..t.frame_count() {
            sum = sum.wrapping_add(t.frames.at(k).pts);
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / frames.max(1) as f64;
    let mapped = held.iter().filter(|t| t.frames.is_mapped()).count();
    println!(
        "{}",
        serde_json::json!({"mode": mode, "tables": n, "frames": frames, "rss_bytes": after.saturating_sub(before),
            "ns_per_frame_read": ns, "mapped": mapped, "checksum": sum})
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if let [flag, mode, n] = args.as_slice() {
        if flag == "--child" {
            child(mode, n.parse().expect("N"));
            return;
        }
    }
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let exe = std::env::current_exe().expect("own path");
    let mut by_mode = serde_json::Map::new();
    for mode in ["vectors", "packed", "store"] {
        let out = std::process::Command::new(&exe)
            .args(["--child", mode, &n.to_string()])
            .output()
            .expect("run child");
        let text = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
            panic!(
                "{mode}: {e}: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        by_mode.insert(mode.to_owned(), v);
    }
    let per = |m: &str| by_mode[m]["rss_bytes"].as_f64().unwrap_or(0.0) / n as f64;
    println!(
        "{}",
        serde_json::json!({
            "tables": n,
            "rss_bytes_per_table": {"vectors": per("vectors"), "packed": per("packed"), "store": per("store")},
            "vectors_over_packed": per("vectors") / per("packed").max(1.0),
            "vectors_over_store": per("vectors") / per("store").max(1.0),
            "modes": by_mode,
        })
    );
}
