//! Unit tests of the config module's parsers and defaults.

use super::*;

#[test]
fn parses_sizes_addresses_and_datasets() {
    assert_eq!(parse_bytes("cache-bytes", "512MiB").unwrap(), 512 << 20);
    assert_eq!(parse_bytes("cache-bytes", "2G").unwrap(), 2 << 30);
    assert_eq!(parse_bytes("cache-bytes", "1000").unwrap(), 1000);
    let e = parse_bytes("cache-bytes", "12 parsecs").unwrap_err();
    assert_eq!(e.key, "cache-bytes");
    assert_eq!(e.value, "12 parsecs");
    assert_eq!(
        parse_listen("unix:/tmp/a.sock").unwrap(),
        ListenAddr::Unix("/tmp/a.sock".into())
    );
    assert_eq!(
        parse_listen("127.0.0.1:7070").unwrap(),
        ListenAddr::Tcp("127.0.0.1:7070".parse().unwrap())
    );
    assert!(parse_listen("localhost").is_err());
    assert_eq!(parse_dataset("kin=/data/k").unwrap().name, "kin");
    assert!(parse_dataset("kin").is_err());
    let d = parse_dataset("kin=/data/k:manifest=/data/train.csv").unwrap();
    assert_eq!(d.root, PathBuf::from("/data/k"));
    assert_eq!(d.manifest, Some(PathBuf::from("/data/train.csv")));
    assert!(parse_dataset("kin=/data/k:manifest=").is_err());
}

#[test]
fn the_inflight_default_follows_the_machine_and_the_cgroup() {
    let gib = 1u64 << 30;
    // 64 GiB machine, 8 GiB cache, 256 MiB index cache: half of the rest.
    assert_eq!(
        inflight_from_memory(Some(64 * gib), None, 8 * gib, 256 << 20),
        (56 * gib - (256 << 20)) / 2
    );
    // A 12 GiB cgroup on that machine rules.
    assert_eq!(
        inflight_from_memory(Some(64 * gib), Some(12 * gib), 2 * gib, 0),
        5 * gib
    );
    // A cache as large as the machine still leaves the floor.
    assert_eq!(inflight_from_memory(Some(gib), None, 2 * gib, 0), 256 << 20);
    assert_eq!(
        mem_total("MemTotal:       16384 kB\nMemFree: 1 kB\n"),
        Some(16 << 20)
    );
    assert_eq!(cgroup_limit("max\n"), None);
    assert_eq!(cgroup_limit("9223372036854771712\n"), None);
    assert_eq!(cgroup_limit("12884901888\n"), Some(12 * gib));
}

#[test]
fn parses_gpu_lists() {
    assert_eq!(parse_gpus("auto").unwrap(), GpuSpec::Auto);
    assert_eq!(parse_gpus("NONE").unwrap(), GpuSpec::None);
    assert_eq!(parse_gpus("all").unwrap(), GpuSpec::All);
    assert_eq!(parse_gpus("1,0, 1").unwrap(), GpuSpec::List(vec![0, 1]));
    assert_eq!(parse_gpus("3").unwrap().to_string(), "3");
    for bad in ["x,", "0,", "", "-1", "gpu0", "0;1", "4096"] {
        let e = parse_gpus(bad).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("gpus", bad));
    }
    assert_eq!(check_nvdec_sessions(4).unwrap(), 4);
    assert_eq!(check_nvdec_sessions(0).unwrap_err().key, "nvdec-sessions");
    assert!(check_nvdec_sessions(33).is_err());
}

#[test]
fn parses_operating_settings() {
    assert_eq!(parse_admin_listen("none").unwrap(), None);
    assert_eq!(
        parse_admin_listen("0.0.0.0:9464").unwrap(),
        Some("0.0.0.0:9464".parse().unwrap())
    );
    assert_eq!(parse_admin_listen("9464").unwrap_err().key, "admin-listen");
    assert_eq!(parse_log_format("JSON").unwrap(), LogFormat::Json);
    assert_eq!(parse_log_format("xml").unwrap_err().key, "log-format");
    assert_eq!(parse_socket_mode("0660").unwrap(), 0o660);
    assert_eq!(parse_socket_mode("0o600").unwrap(), 0o600);
    assert_eq!(parse_socket_mode("0999").unwrap_err().key, "socket-mode");
    assert!(parse_socket_mode("7777").is_err());
    let dir = tempfile::tempdir().unwrap();
    let groups = dir.path().join("group");
    std::fs::write(&groups, "root:x:0:\nvideo:x:44:alice,bob\n").unwrap();
    assert_eq!(parse_socket_group("video", &groups).unwrap(), 44);
    assert_eq!(parse_socket_group("1234", &groups).unwrap(), 1234);
    assert_eq!(
        parse_socket_group("nogroup", &groups).unwrap_err().key,
        "socket-group"
    );
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    assert_eq!(read_token("auth-token-file", &token).unwrap(), "s3cret");
    std::fs::write(&token, "\n").unwrap();
    assert!(read_token("auth-token-file", &token).is_err());
}
