//! `vserve quarantine list|clear` and the Quarantine RPC, through the real daemon: a file that crashed a
//! daemon (the debug binary's `VSERVE_TEST_ABORT_ON` hook, as in tests/guard.rs) is listed (online and
//! from the state directory), refused as DATA_LOSS, cleared only by the daemon's own user on the Unix
//! socket (a TCP client gets PERMISSION_DENIED), then served byte-exact, and stays cleared after a
//! restart.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use vserve_client::proto;

/// The listed paths of `vserve quarantine list ARGS --json`.
fn listed(args: &[&str]) -> Vec<String> {
    let mut all = vec!["quarantine", "list", "--json"];
    all.extend_from_slice(args);
    let v: Value = serde_json::from_str(&cli_stdout(&all)).expect("json");
    v["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            assert!(f["size"].as_u64().unwrap() > 0, "{f}");
            assert!(f["since"].as_u64().unwrap() > 1_700_000_000, "{f}");
            assert!(f["reason"].as_str().unwrap().contains("crashed"), "{f}");
            f["path"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn control_clip(video: &str) -> proto::GetClipsRequest {
    clips_req(
        "poison",
        vec![frames_clip(video, &[0, 1, 2, 3], None)],
        Some(no_rotate()),
    )
}

fn assert_control_frames(b: &vserve_client::Batch, what: &str) {
    let want = Ffmpeg {
        noautorotate: true,
        ..Default::default()
    }
    .frames(&media_path(CONTROL_VIDEO), 50, 50, Some(&[0, 1, 2, 3]));
    for (k, got) in u8_frames(b, 4, 50, 50).iter().enumerate() {
        assert_bytes_eq(
            got,
            &want[&(k as u64)],
            Some((50, 50)),
            &format!("{what}: frame {k}"),
        );
    }
}

async fn start(root: &Path, state: &Path, env: &[(&str, &str)]) -> Daemon {
    Daemon::start_with_env(
        &[
            "--dataset",
            &format!("poison={}", root.display()),
            "--state-dir",
            state.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        env,
    )
    .await
}

#[tokio::test]
async fn an_operator_lists_and_clears_the_quarantine_and_the_file_is_served_again() {
    let dir = tempfile::tempdir().unwrap();
    let (root, state) = (dir.path().join("videos"), dir.path().join("state"));
    std::fs::create_dir(&root).unwrap();
    for n in ["good.mov", "poison.mov"] {
        std::fs::copy(media_path(CONTROL_VIDEO), root.join(n)).unwrap();
    }
    let state_s = state.to_str().unwrap();

    // A GetClips of poison.mov kills the daemon inside the decode.
    let mut d = start(
        &root,
        &state,
        &[("VSERVE_TEST_ABORT_ON", "decode:poison.mov")],
    )
    .await;
    let mut c = d.client().await;
    let _ = c.get_clips(control_clip("poison.mov")).await;
    let code = d.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(
        code,
        Some(None),
        "killed by the abort hook:\n{}",
        d.log_text()
    );
    assert!(
        listed(&["--state-dir", state_s]).is_empty(),
        "quarantined only at the next start"
    );

    // Restarted without the hook: quarantined, listed by the daemon and from the state directory.
    let mut d = start(&root, &state, &[]).await;
    let mut c = d.client().await;
    let tcp = d.tcp_addr();
    let paths = listed(&["--addr", &d.addr]);
    assert_eq!(paths.len(), 1, "{paths:?}");
    let poison = paths[0].clone();
    assert!(poison.ends_with("/videos/poison.mov"), "{poison}");
    assert_eq!(listed(&["--state-dir", state_s]), paths);
    // Anyone who can connect may list, TCP included; the readable form names the file and the place.
    let text = cli_stdout(&["quarantine", "list", "--addr", &tcp]);
    assert!(
        text.contains("1 file(s) in quarantine") && text.contains("quarantine.json"),
        "{text}"
    );
    assert!(text.contains(&format!("{poison}  size=")), "{text}");
    let res = c.get_clips(control_clip("poison.mov")).await;
    expect_code(res, &["DATA_LOSS"], "GetClips of a quarantined file");

    // A TCP client is not the daemon's user: PERMISSION_DENIED, nothing cleared.
    let out = vserve_cli(&["quarantine", "clear", "--addr", &tcp, "--path", &poison]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("PERMISSION_DENIED"), "{err}");
    let out = vserve_cli(&["quarantine", "clear", "--addr", &tcp, "--all"]);
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("PERMISSION_DENIED"));
    // An unknown path clears nothing, even beside a listed one.
    let out = vserve_cli(&[
        "quarantine",
        "clear",
        "--addr",
        &d.addr,
        "--path",
        &poison,
        "--path",
        "/no/such.mov",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("NOT_FOUND"));
    // Usage errors: neither --path nor --all, or both.
    assert_eq!(
        vserve_cli(&["quarantine", "clear", "--addr", &d.addr])
            .status
            .code(),
        Some(64)
    );
    let both = vserve_cli(&[
        "quarantine",
        "clear",
        "--addr",
        &d.addr,
        "--all",
        "--path",
        &poison,
    ]);
    assert_eq!(both.status.code(), Some(64));
    assert_eq!(listed(&["--addr", &d.addr]), paths);
    let res = c.get_clips(control_clip("poison.mov")).await;
    expect_code(res, &["DATA_LOSS"], "still quarantined");

    // The daemon's own user on the Unix socket clears it: served again, byte-exact.
    let out = cli_stdout(&["quarantine", "clear", "--addr", &d.addr, "--path", &poison]);
    assert_eq!(out.trim(), format!("cleared {poison}"));
    assert!(listed(&["--addr", &d.addr]).is_empty());
    assert!(listed(&["--state-dir", state_s]).is_empty());
    let b = c
        .get_clips(control_clip("poison.mov"))
        .await
        .expect("a cleared file is served");
    assert_control_frames(&b, "poison.mov after clear");
    assert!(d.log_text().contains("cleared from the quarantine"));
    d.terminate();
    assert_eq!(d.wait_exit(Duration::from_secs(15)).await, Some(Some(0)));

    // Cleared for good: not back after a restart.
    let d = start(&root, &state, &[]).await;
    let mut c = d.client().await;
    let v: Value = serde_json::from_str(&cli_stdout(&[
        "quarantine",
        "list",
        "--json",
        "--addr",
        &d.addr,
    ]))
    .unwrap();
    assert_eq!(v["files"], serde_json::json!([]));
    assert!(v["location"].as_str().unwrap().ends_with("quarantine.json"));
    let b = c
        .get_clips(control_clip("poison.mov"))
        .await
        .expect("served");
    assert_control_frames(&b, "poison.mov after a restart");
    // The offline form of a directory that does not exist fails on this side: EX_NOINPUT, no status
    // name (it exited 1 as NOT_FOUND, as if a daemon had said so: probe F).
    let out = vserve_cli(&["quarantine", "list", "--state-dir", "/no/such/dir"]);
    assert_eq!(out.status.code(), Some(66));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "vserve: no state directory /no/such/dir"
    );
}
