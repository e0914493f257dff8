//! Tests of [`super`]: flags over file, `vserve config` read back, keys named in errors.

use super::*;

#[test]
fn file_fills_what_flags_leave_open_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.toml");
    std::fs::write(
        &path,
        "listen = [\"127.0.0.1:7000\"]\ndataset = [\"a=/x\"]\ncache-bytes = \"1GiB\"\ndecode-threads = 3\n",
    )
    .unwrap();
    let args = ServeArgs {
        config: Some(path.clone()),
        decode_threads: Some(5),
        ..ServeArgs::default()
    };
    let c = args.to_config().unwrap();
    assert_eq!(c.cache.bytes, 1 << 30);
    assert_eq!(c.decode.threads, 5);
    assert_eq!(c.datasets[0].name, "a");
    assert_eq!(c.listen[0].to_string(), "127.0.0.1:7000");
    // What `vserve config` prints reads back as the same configuration.
    let printed = dir.path().join("p.toml");
    std::fs::write(&printed, config_to_toml(&c)).unwrap();
    let again = ServeArgs {
        config: Some(printed),
        ..ServeArgs::default()
    }
    .to_config()
    .unwrap();
    assert_eq!(again, c);
}

#[test]
fn bad_values_name_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.toml");
    std::fs::write(&path, "decode-threadz = 3\n").unwrap();
    let e = ServeArgs {
        config: Some(path),
        ..ServeArgs::default()
    }
    .to_config()
    .unwrap_err();
    assert!(e.to_string().contains("decode-threadz"), "{e}");
    let e = ServeArgs {
        decode_threads: Some(0),
        ..ServeArgs::default()
    }
    .to_config()
    .unwrap_err();
    assert_eq!(e.key, "decode-threads");
}

#[test]
fn cache_admit_fraction_is_kept_printed_and_bounded() {
    let c = ServeArgs {
        cache_admit_fraction: Some(0.125),
        ..ServeArgs::default()
    }
    .to_config()
    .unwrap();
    assert_eq!(c.cache.admit_ppm, 125_000);
    assert!(
        config_to_toml(&c).contains("cache-admit-fraction = 0.125\n"),
        "{}",
        config_to_toml(&c)
    );
    let default = ServeArgs::default().to_config().unwrap();
    assert_eq!(default.cache.admit_ppm, crate::config::DEFAULT_ADMIT_PPM);
    for bad in [-0.1, 1.5, f64::NAN] {
        let e = ServeArgs {
            cache_admit_fraction: Some(bad),
            ..ServeArgs::default()
        }
        .to_config()
        .unwrap_err();
        assert_eq!(e.key, "cache-admit-fraction", "{bad}");
    }
}

/// `--max-output-bytes 0` refused every request and stream batch, and `--store-bytes 0` every stored
/// table, both accepted at start-up; now refused there, naming the key, from a flag or the file.
#[test]
fn zero_output_and_store_bounds_are_refused() {
    for (max_output_bytes, store_bytes, key) in [
        (Some("0"), None, "max-output-bytes"),
        (None, Some("0"), "store-bytes"),
    ] {
        let e = ServeArgs {
            max_output_bytes: max_output_bytes.map(str::to_owned),
            store_bytes: store_bytes.map(str::to_owned),
            ..ServeArgs::default()
        }
        .to_config()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("invalid {key} \"0\": must be at least 1 byte")
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.toml");
    std::fs::write(&path, "max-output-bytes = 0\n").unwrap();
    let e = ServeArgs {
        config: Some(path),
        ..ServeArgs::default()
    }
    .to_config()
    .unwrap_err();
    assert_eq!(e.key, "max-output-bytes");
    let c = ServeArgs {
        max_output_bytes: Some("1".into()),
        store_bytes: Some("1".into()),
        ..ServeArgs::default()
    }
    .to_config()
    .unwrap();
    assert_eq!((c.limits.max_output_bytes, c.cache.store_bytes), (1, 1));
}

/// `listen = []` in the file served on the default socket, as if the key were absent; now refused.
#[test]
fn an_empty_listen_list_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.toml");
    std::fs::write(&path, "listen = []\n").unwrap();
    let e = ServeArgs {
        config: Some(path.clone()),
        ..ServeArgs::default()
    }
    .to_config()
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid listen \"[]\": an empty list; name at least one address, or leave `listen` out for the default socket"
    );
    // A flag still replaces the file's list.
    let c = ServeArgs {
        config: Some(path),
        listen: vec!["127.0.0.1:7001".into()],
        ..ServeArgs::default()
    }
    .to_config()
    .unwrap();
    assert_eq!(c.listen[0].to_string(), "127.0.0.1:7001");
}
