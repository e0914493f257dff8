//! Configuration and process behaviour: a TOML file, `VSERVE_*` env and flags name the same settings
//! (flag > env > file), invalid values exit 64 naming the key, TCP and Unix listeners serve the same API,
//! and SIGTERM stops the daemon cleanly (exit 0, socket file removed).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vserve_client::Client;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_vserve")
}

fn demo_dir() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/demo").to_owned()
}

/// `vserve config` with the given args and env; (exit code, stdout, stderr).
fn config(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(bin());
    cmd.arg("config").args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("VSERVE_")) {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run vserve config");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn line<'a>(toml: &'a str, key: &str) -> &'a str {
    toml.lines()
        .find(|l| l.starts_with(&format!("{key} =")))
        .unwrap_or_else(|| panic!("no {key} in:\n{toml}"))
}

#[test]
fn file_env_and_flags_share_names_and_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vserve.toml");
    std::fs::write(
        &file,
        "dataset = [\"demo=/srv/demo\"]\ncache-bytes = \"1GiB\"\ndecode-threads = 3\nmax-side = 4000\nshutdown-grace = 4\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    // File alone.
    let (code, out, err) = config(&["--config", f], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(line(&out, "cache-bytes"), "cache-bytes = 1073741824");
    assert_eq!(line(&out, "decode-threads"), "decode-threads = 3");
    assert_eq!(line(&out, "max-side"), "max-side = 4000");
    assert_eq!(line(&out, "dataset"), "dataset = [\"demo=/srv/demo\"]");
    assert_eq!(line(&out, "shutdown-grace"), "shutdown-grace = 4");
    // Deadlines: defaults, then file < env < flag.
    assert_eq!(line(&out, "decode-deadline"), "decode-deadline = 60");
    assert_eq!(line(&out, "index-deadline"), "index-deadline = 600");
    let deadlines = dir.path().join("deadlines.toml");
    std::fs::write(&deadlines, "decode-deadline = 5\nindex-deadline = 7.5\n").unwrap();
    let d = deadlines.to_str().unwrap();
    let (code, out, err) = config(&["--config", d], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(line(&out, "decode-deadline"), "decode-deadline = 5");
    assert_eq!(line(&out, "index-deadline"), "index-deadline = 7.5");
    let (code, out, err) = config(
        &["--config", d, "--decode-deadline", "2"],
        &[
            ("VSERVE_DECODE_DEADLINE", "3"),
            ("VSERVE_INDEX_DEADLINE", "9"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(line(&out, "decode-deadline"), "decode-deadline = 2");
    assert_eq!(line(&out, "index-deadline"), "index-deadline = 9");
    // Env over file; the config file itself can come from env.
    let (code, out, err) = config(
        &[],
        &[
            ("VSERVE_CONFIG", f),
            ("VSERVE_DECODE_THREADS", "5"),
            ("VSERVE_CACHE_BYTES", "2G"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(line(&out, "decode-threads"), "decode-threads = 5");
    assert_eq!(line(&out, "cache-bytes"), "cache-bytes = 2147483648");
    assert_eq!(line(&out, "max-side"), "max-side = 4000");
    // Flag over env over file.
    let (code, out, err) = config(
        &["--config", f, "--decode-threads", "7", "--dataset", "a=/x"],
        &[("VSERVE_DECODE_THREADS", "5")],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(line(&out, "decode-threads"), "decode-threads = 7");
    assert_eq!(line(&out, "dataset"), "dataset = [\"a=/x\"]");
    // The printed configuration is itself a valid config file giving the same configuration.
    let printed = dir.path().join("printed.toml");
    std::fs::write(&printed, &out).unwrap();
    let (code, again, err) = config(&["--config", printed.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(again, out);
}

#[test]
fn invalid_values_exit_64_naming_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let bad_file = dir.path().join("bad.toml");
    std::fs::write(&bad_file, "decode-threadz = 2\n").unwrap();
    // (flags, env, key the message must name, value it must quote)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![],
            vec![("VSERVE_CACHE_BYTES", "12parsecs")],
            "cache-bytes",
            "12parsecs",
        ),
        (
            vec!["--cache-bytes", "12parsecs"],
            vec![],
            "cache-bytes",
            "12parsecs",
        ),
        (vec!["--decode-threads", "0"], vec![], "decode-threads", "0"),
        // Caches larger than the host's memory: a unit typo, taken as given (probe G).
        (
            vec!["--cache-bytes", "1000000TiB"],
            vec![],
            "cache-bytes",
            "976.6 PiB",
        ),
        (
            vec![],
            vec![("VSERVE_INDEX_CACHE_BYTES", "100000TiB")],
            "index-cache-bytes",
            "97.7 PiB",
        ),
        // Negative values are values to name, not unknown flags; a negative size says so (it was
        // "unexpected argument '-1'", and through env "unknown unit": probe C).
        (vec!["--cache-bytes", "-1"], vec![], "cache-bytes", "-1"),
        (
            vec!["--decode-deadline", "-1"],
            vec![],
            "decode-deadline",
            "-1",
        ),
        (
            vec![],
            vec![("VSERVE_CACHE_BYTES", "-1")],
            "cache-bytes",
            "-1",
        ),
        (
            vec!["--decode-deadline", "0"],
            vec![],
            "decode-deadline",
            "0",
        ),
        (
            vec![],
            vec![("VSERVE_INDEX_DEADLINE", "inf")],
            "index-deadline",
            "inf",
        ),
        (vec!["--listen", "localhost"], vec![], "listen", "localhost"),
        (vec!["--dataset", "nodir"], vec![], "dataset", "nodir"),
        (
            vec![],
            vec![("VSERVE_DECODE_THREADS", "abc")],
            "decode-threads",
            "abc",
        ),
        (
            vec!["--config", bad_file.to_str().unwrap()],
            vec![],
            "config",
            "decode-threadz",
        ),
    ];
    for (args, env, key, value) in cases {
        let (code, _, err) = config(&args, &env);
        assert_eq!(code, 64, "{args:?} {env:?}: exit code; stderr: {err}");
        assert!(
            err.contains(key) && err.contains(value),
            "{args:?} {env:?}: stderr must name {key} and {value}: {err}"
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn serves_tcp_and_unix_from_a_config_file_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run/vserve.sock");
    let port = free_port();
    let file = dir.path().join("vserve.toml");
    std::fs::write(
        &file,
        format!(
            "listen = [\"unix:{}\", \"127.0.0.1:{port}\"]\ndataset = [\"demo={}\"]\ndecode-threads = 2\n",
            sock.display(),
            demo_dir()
        ),
    )
    .unwrap();
    let mut child = Command::new(bin())
        .args(["--config", file.to_str().unwrap()])
        .env("VSERVE_CACHE_BYTES", "64MiB")
        // Never the default admin port: tests run in parallel.
        .env("VSERVE_ADMIN_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start daemon");
    let tcp = format!("127.0.0.1:{port}");
    let unix = format!("unix:{}", sock.display());
    let started = Instant::now();
    let mut clients = Vec::new();
    for addr in [&unix, &tcp] {
        loop {
            match Client::connect(addr).await {
                Ok(c) => {
                    clients.push(c);
                    break;
                }
                Err(_) if started.elapsed() < Duration::from_secs(20) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("daemon not reachable on {addr}: {e}"),
            }
        }
    }
    let mut replies = Vec::new();
    for c in &mut clients {
        let d = c.list_datasets().await.expect("ListDatasets");
        assert_eq!(d.datasets.len(), 1);
        assert_eq!(d.datasets[0].name, "demo");
        assert_eq!(d.datasets[0].video_count, 3);
        let b = c
            .get_clips(vserve_client::proto::GetClipsRequest {
                dataset: "demo".into(),
                clips: vec![vserve_client::clip_frames("nasa_13013.mp4", &[0, 240])],
                transform: None,
                ..Default::default()
            })
            .await
            .expect("GetClips");
        assert_eq!(b.header.shape, vec![1, 2, 270, 480, 3]);
        replies.push(b.data);
    }
    assert!(replies[0] == replies[1], "TCP and Unix replies differ");
    // A call in flight when SIGTERM arrives completes: every frame of chaplin.mp4 (one 241-frame GOP).
    let mut busy = clients[0].clone();
    let in_flight = tokio::spawn(async move {
        busy.get_clips(vserve_client::proto::GetClipsRequest {
            dataset: "demo".into(),
            clips: vec![vserve_client::clip_frames(
                "chaplin.mp4",
                &(0..241).collect::<Vec<u64>>(),
            )],
            transform: Some(vserve_client::proto::Transform {
                resize: Some(vserve_client::proto::transform::Resize::ShortSide(36)),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    // SIGTERM: exit 0 and remove the socket file.
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let drained = in_flight
        .await
        .unwrap()
        .expect("the call in flight completes");
    assert_eq!(drained.header.shape, vec![1, 241, 36, 64, 3]);
    drop(clients);
    let killed = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "daemon did not exit on SIGTERM");
        // Async sleep: the runtime keeps serving the client side of any connection (GOAWAY, PING).
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut log = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut log);
    }
    eprintln!("exit after {:?}", killed.elapsed());
    assert_eq!(status.code(), Some(0), "exit status; log:\n{log}");
    assert!(!sock.exists(), "socket file left behind; log:\n{log}");
    assert!(log.contains("stopped"), "log:\n{log}");
}

/// `--dataset` takes its value whole, so a directory may hold a comma (it was split there, and
/// "d=/data/co,mma" failed as a dataset "mma"); `VSERVE_DATASET` is still a comma-separated list, and a
/// flag still wins over it.
#[test]
fn a_dataset_flag_is_taken_whole_and_the_env_list_is_split() {
    let (code, out, err) = config(&["--dataset", "d=/data/co,mma"], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(line(&out, "dataset"), "dataset = [\"d=/data/co,mma\"]");
    let (code, out, err) = config(&[], &[("VSERVE_DATASET", "a=/data/a,b=/data/b")]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        line(&out, "dataset"),
        "dataset = [\"a=/data/a\", \"b=/data/b\"]"
    );
    let (code, out, err) = config(
        &["--dataset", "f=/data/f"],
        &[("VSERVE_DATASET", "a=/data/a,b=/data/b")],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(line(&out, "dataset"), "dataset = [\"f=/data/f\"]");
}

/// A boolean setting's variable takes the usual spellings (1/0, yes/no, on/off as well as true/false:
/// `VSERVE_ALLOW_INSECURE_TCP=1` stopped the daemon, exit 64), and `vserve config` prints it either way
/// (it was left out when off: probe C).
#[test]
fn boolean_variables_take_the_usual_spellings_and_config_prints_them() {
    for (value, want) in [
        ("1", true),
        ("yes", true),
        ("on", true),
        ("true", true),
        ("0", false),
        ("no", false),
        ("off", false),
    ] {
        let (code, out, err) = config(&[], &[("VSERVE_ALLOW_INSECURE_TCP", value)]);
        assert_eq!(code, 0, "{value}: {err}");
        assert_eq!(
            line(&out, "allow-insecure-tcp"),
            format!("allow-insecure-tcp = {want}"),
            "{value}"
        );
    }
    let (_, out, _) = config(&[], &[]);
    assert_eq!(
        line(&out, "allow-insecure-tcp"),
        "allow-insecure-tcp = false"
    );
}

/// Flag > env > file holds for a boolean turned off: `VSERVE_ALLOW_INSECURE_TCP=false` over a file's
/// `allow-insecure-tcp = true` still served an open, unauthenticated port (probe F); and
/// `--allow-insecure-tcp=false` over the variable. An empty variable counts as unset (it was refused,
/// naming the flag: exit 64).
#[test]
fn a_boolean_turned_off_overrides_the_file_and_an_empty_variable_is_unset() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("v.toml");
    std::fs::write(&file, "allow-insecure-tcp = true\n").unwrap();
    let file = file.to_str().unwrap();
    for (args, env, want) in [
        (vec!["--config", file], vec![], true),
        (
            vec!["--config", file],
            vec![("VSERVE_ALLOW_INSECURE_TCP", "false")],
            false,
        ),
        (
            vec!["--config", file],
            vec![("VSERVE_ALLOW_INSECURE_TCP", "off")],
            false,
        ),
        (
            vec!["--config", file, "--allow-insecure-tcp=false"],
            vec![],
            false,
        ),
        (
            vec!["--config", file],
            vec![("VSERVE_ALLOW_INSECURE_TCP", "")],
            true,
        ),
        (
            vec!["--allow-insecure-tcp"],
            vec![("VSERVE_ALLOW_INSECURE_TCP", "0")],
            true,
        ),
        (
            vec!["--allow-insecure-tcp=false"],
            vec![("VSERVE_ALLOW_INSECURE_TCP", "1")],
            false,
        ),
        (vec![], vec![("VSERVE_ALLOW_INSECURE_TCP", "")], false),
    ] {
        let (code, out, err) = config(&args, &env);
        assert_eq!(code, 0, "{args:?} {env:?}: {err}");
        assert_eq!(
            line(&out, "allow-insecure-tcp"),
            format!("allow-insecure-tcp = {want}"),
            "{args:?} {env:?}"
        );
    }
    let (code, _, err) = config(&[], &[("VSERVE_MAX_STREAMS", "")]);
    assert_eq!(code, 0, "an empty number variable is unset: {err}");
}
