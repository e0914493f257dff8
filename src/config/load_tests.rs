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
