use super::*;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn csv_with_header_quotes_and_trims() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "m.csv",
        "label,path,start,end\n\"playing guitar, loudly\",a/x.mp4,1.5,4\nswimming,b.mp4,,\r\n\n",
    );
    let s = Samples::from_manifest(&p).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s.get(0).video, "a/x.mp4");
    assert_eq!(s.get(0).label, Some("playing guitar, loudly"));
    assert_eq!((s.get(0).start, s.get(0).end), (Some(1.5), Some(4.0)));
    assert_eq!((s.get(1).start, s.get(1).end), (None, None));
    // Sorted distinct labels: "playing guitar, loudly" < "swimming".
    assert_eq!(s.get(0).label_index, 0);
    assert_eq!(s.get(1).label_index, 1);
    assert_eq!(
        s.classes(),
        vec![
            ("playing guitar, loudly".to_owned(), 0),
            ("swimming".to_owned(), 1)
        ]
    );
}

#[test]
fn headerless_csv_and_integer_labels() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "m.csv", "x.mp4,7\ny.mp4,3\nz.mp4\n");
    let s = Samples::from_manifest(&p).unwrap();
    let idx: Vec<i64> = s.iter().map(|s| s.label_index).collect();
    assert_eq!(idx, vec![7, 3, -1]);
    // Integer labels are their own indices; a row without a label adds no class.
    assert_eq!(s.classes(), vec![("3".to_owned(), 3), ("7".to_owned(), 7)]);
    assert_eq!(s.warning(), None);
    // A negative integer label is its own index too, which -1 ("no label") would share: warned.
    let p = write(
        dir.path(),
        "n.csv",
        "x.mp4,-3
y.mp4,3
",
    );
    let w = Samples::from_manifest(&p).unwrap().warning().unwrap();
    assert!(w.contains("label \"-3\" has label_index -3"), "{w}");
}

#[test]
fn common_header_names_and_a_stray_label_are_recognised() {
    let dir = tempfile::tempdir().unwrap();
    // `filename,class` is a header: its row is no sample, and the labels stay their integers.
    let p = write(dir.path(), "h.csv", "filename,class\nx.mp4,7\ny.mp4,3\n");
    let s = Samples::from_manifest(&p).unwrap();
    assert_eq!(s.len(), 2);
    let idx: Vec<i64> = s.iter().map(|s| s.label_index).collect();
    assert_eq!(idx, vec![7, 3]);
    assert_eq!(s.warning(), None);
    // A header that names no known column is a sample; its label turns every index into a rank,
    // which is warned about, naming the stray label.
    let p = write(dir.path(), "s.csv", "clip,target\nx.mp4,7\ny.mp4,3\n");
    let s = Samples::from_manifest(&p).unwrap();
    let idx: Vec<i64> = s.iter().map(|s| s.label_index).collect();
    assert_eq!(idx, vec![2, 1, 0]);
    let w = s.warning().expect("a warning");
    assert!(
        w.starts_with("2 of 3 distinct labels are integers, but 1 is not (\"target\")"),
        "{w}"
    );
    // Names throughout: the rule, no warning.
    let p = write(dir.path(), "n.csv", "x.mp4,cat\ny.mp4,dog\nz.mp4,7\n");
    assert_eq!(Samples::from_manifest(&p).unwrap().warning(), None);
    // Two spellings of one integer share its index as two classes: warned about, naming them.
    let p = write(
        dir.path(),
        "i.csv",
        "x.mp4,3\ny.mp4,03\nz.mp4,+3\nw.mp4,4\n",
    );
    let s = Samples::from_manifest(&p).unwrap();
    let idx: Vec<i64> = s.iter().map(|s| s.label_index).collect();
    assert_eq!(idx, vec![3, 3, 3, 4]);
    let w = s.warning().expect("a warning");
    assert!(w.contains("\"03\"") && w.contains("\"+3\""), "{w}");
    assert!(w.contains("different strings of one integer"), "{w}");
    // An empty manifest, or a header alone, reads (a dataset may be filled later) but is warned about.
    for text in ["", "path,label\n"] {
        let p = write(dir.path(), "e.csv", text);
        let w = Samples::from_manifest(&p).unwrap().warning();
        assert!(w.expect("a warning").contains("no samples"), "{text:?}");
    }
}

#[test]
fn a_list_read_twice_is_equal_with_trimmed_and_untrimmed_rows() {
    let dir = tempfile::tempdir().unwrap();
    // Untrimmed rows hold NaN beside trimmed ones; the lists are still equal, so a reload of an
    // unchanged manifest is no change.
    let p = write(
        dir.path(),
        "t.csv",
        "path,label,start,end\na.mp4,x,1,2\nb.mp4,y,,\n",
    );
    let (a, b) = (
        Samples::from_manifest(&p).unwrap(),
        Samples::from_manifest(&p).unwrap(),
    );
    assert_eq!(a, b);
    let p2 = write(
        dir.path(),
        "u.csv",
        "path,label,start,end\na.mp4,x,1,3\nb.mp4,y,,\n",
    );
    assert_ne!(a, Samples::from_manifest(&p2).unwrap());
}

#[test]
fn jsonl_rows_and_errors_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "m.jsonl",
        "{\"path\": \"a.mp4\", \"label\": \"cat\", \"start\": 0.5}\n\n{\"video\": \"b.mp4\", \"label\": 2}\n{\"path\": \"line\\nbreak.mp4\"}\n",
    );
    let s = Samples::from_manifest(&p).unwrap();
    assert_eq!(s.get(0).start, Some(0.5));
    assert_eq!(s.get(1).label, Some("2"));
    // A file name may hold a line break, which JSON says unambiguously (it was refused, and the daemon
    // did not start: probe E).
    assert_eq!(s.get(2).video, "line\nbreak.mp4");
    let bad = write(
        dir.path(),
        "bad.jsonl",
        "{\"path\": \"a.mp4\"}\n{\"label\": 1}\n",
    );
    match Samples::from_manifest(&bad) {
        Err(ManifestError::Parse { line, .. }) => assert_eq!(line, 2),
        other => panic!("{other:?}"),
    }
    let bad = write(dir.path(), "bad.csv", "path,start,end\na.mp4,3,2\n");
    assert!(matches!(
        Samples::from_manifest(&bad),
        Err(ManifestError::Parse { line: 2, .. })
    ));
}

#[test]
fn scan_is_sorted_and_relative() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    for f in ["b/z.mp4", "a.mkv", "b/a.webm", "notes.txt"] {
        std::fs::write(dir.path().join(f), b"x").unwrap();
    }
    let missing = Samples::scan(&dir.path().join("no-such-root")).unwrap_err();
    assert!(missing.contains("1 unreadable directory"), "{missing}");
    let s = Samples::scan(dir.path()).unwrap();
    let v: Vec<&str> = s.iter().map(|s| s.video).collect();
    assert_eq!(v, vec!["a.mkv", "b/a.webm", "b/z.mp4"]);
}

#[test]
fn csv_quoted_fields_hold_commas_quotes_and_line_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "m.csv",
        "id,path,label,end\r\n7,\"dir, with comma/a.mp4\",\"say \"\"hi\"\"\",2.5\n\n8,b.mp4,\"two\nlines\",\n   \n9,  c.mp4  ,plain,\n",
    );
    let s = Samples::from_manifest(&p).unwrap();
    let rows: Vec<_> = s.iter().map(|s| (s.video, s.label, s.end)).collect();
    assert_eq!(
        rows,
        vec![
            ("dir, with comma/a.mp4", Some("say \"hi\""), Some(2.5)),
            ("b.mp4", Some("two\nlines"), None),
            ("c.mp4", Some("plain"), None),
        ]
    );
    // Sorted distinct labels: "plain" < "say \"hi\"" < "two\nlines".
    let idx: Vec<i64> = s.iter().map(|s| s.label_index).collect();
    assert_eq!(idx, vec![1, 2, 0]);
    assert_eq!(s.get(2).start, None);
}

#[test]
fn csv_bad_rows_name_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // After a quoted field spanning lines 2 and 3, the bad row is on line 5.
        (
            "path,label,start\na.mp4,\"x\ny\",1\nb.mp4,z,2\nc.mp4,z,soon\n",
            5,
            "start \"soon\"",
        ),
        ("a.mp4,cat\n,dog\n", 2, "empty path"),
        ("a.mp4\n\"b.mp4,cat\nc.mp4\n", 2, "line break"),
        // A quote left open on the last line: its line break is the path's, not trimmed away (the rest
        // was read as the path "unterminated": probe C).
        ("path,label\na.mp4,cat\n\"unterminated\n", 3, "line break"),
        (
            "path,start,end\na.mp4,0,1\nb.mp4,3,2\n",
            3,
            "not after start",
        ),
    ];
    for (i, (text, line, why)) in cases.iter().enumerate() {
        let p = write(dir.path(), &format!("bad{i}.csv"), text);
        match Samples::from_manifest(&p) {
            Err(ManifestError::Parse {
                line: l, reason, ..
            }) => {
                assert_eq!(l, *line, "{text:?}: {reason}");
                assert!(reason.contains(why), "{text:?}: {reason}");
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
    let p = write(dir.path(), "latin1.csv", "");
    std::fs::write(&p, b"a.mp4,ok\nb.mp4,caf\xe9\n").unwrap();
    assert!(matches!(
        Samples::from_manifest(&p),
        Err(ManifestError::Parse { line: 2, .. })
    ));
    assert!(matches!(
        Samples::from_manifest(&dir.path().join("missing.csv")),
        Err(ManifestError::Io { .. })
    ));
}

#[test]
fn a_large_manifest_ranks_many_labels_exactly() {
    // 200,000 rows over 5,003 labels whose text order differs from their numbering ("L10" < "L2"),
    // in a scattered order, some rows unlabelled, some trimmed.
    const ROWS: usize = 200_000;
    const LABELS: usize = 5_003;
    let label_of = |i: usize| (i * 7_919) % LABELS;
    let mut text = String::from("path,label,start,end\n");
    for i in 0..ROWS {
        let label = if i % 101 == 0 {
            String::new()
        } else {
            format!("L{}", label_of(i))
        };
        let trim = if i % 3 == 0 { "1.5,2.5" } else { "," };
        text.push_str(&format!("d{}/v{i}.mp4,{label},{trim}\n", i / 1000));
    }
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "big.csv", &text);
    let s = Samples::from_manifest(&p).unwrap();
    assert_eq!(s.len(), ROWS);
    // The expected ranks, from an independent sort of the distinct labels used.
    let mut used: Vec<String> = (0..ROWS)
        .filter(|i| i % 101 != 0)
        .map(|i| format!("L{}", label_of(i)))
        .collect();
    used.sort();
    used.dedup();
    assert_eq!(used.len(), LABELS);
    let rank: HashMap<&str, i64> = used
        .iter()
        .enumerate()
        .map(|(r, l)| (l.as_str(), r as i64))
        .collect();
    assert_eq!(rank["L0"], 0);
    assert_eq!(rank["L1"], 1);
    assert_eq!(rank["L10"], 2);
    for i in 0..ROWS {
        let got = s.get(i);
        assert_eq!(got.video, format!("d{}/v{i}.mp4", i / 1000));
        if i % 101 == 0 {
            assert_eq!((got.label, got.label_index), (None, -1), "row {i}");
        } else {
            let want = format!("L{}", label_of(i));
            assert_eq!(got.label, Some(want.as_str()), "row {i}");
            assert_eq!(got.label_index, rank[want.as_str()], "row {i}");
        }
        let want_trim = if i % 3 == 0 {
            (Some(1.5), Some(2.5))
        } else {
            (None, None)
        };
        assert_eq!((got.start, got.end), want_trim, "row {i}");
    }
    let classes = s.classes();
    assert_eq!(classes.len(), LABELS);
    for (l, i) in &classes {
        assert_eq!(rank[l.as_str()], *i, "{l}");
    }
    assert!(classes.windows(2).all(|w| w[0].0 < w[1].0));
    // Compact: the arena of paths plus 12 bytes a row, 16 more for the trims, a little per label.
    let paths: usize = (0..ROWS).map(|i| s.video(i).len()).sum();
    assert!(
        s.approx_bytes() <= paths + ROWS * 28 + LABELS * 40,
        "{} bytes",
        s.approx_bytes()
    );
}

#[test]
fn gulp_label_indices_replace_the_ranks_they_name() {
    let s = Samples::from_labeled(vec![
        ("a".into(), Some("dog".into())),
        ("b".into(), Some("cat".into())),
        ("c".into(), None),
        ("d".into(), Some("dog".into())),
    ])
    .with_label_indices(|l| (l == "dog").then_some(40));
    let idx: Vec<i64> = s.iter().map(|s| s.label_index).collect();
    assert_eq!(idx, vec![40, 0, -1, 40]);
    assert_eq!(
        s.classes(),
        vec![("cat".to_owned(), 0), ("dog".to_owned(), 40)]
    );
}

/// A manifest saved with a UTF-8 byte-order mark (as Windows editors write one): the first JSON Lines line
/// did not parse ("line 1: expected value at line 1 column 1"); the csv crate already skipped it. The
/// mark is skipped for both; line numbers are unchanged.
#[test]
fn a_byte_order_mark_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write(
        dir.path(),
        "m.csv",
        "\u{feff}path,label\na.mp4,cat\nb.mp4,dog\n",
    );
    let s = Samples::from_manifest(&csv).unwrap();
    let rows: Vec<_> = s
        .iter()
        .map(|s| (s.video, s.label, s.label_index))
        .collect();
    assert_eq!(rows, [("a.mp4", Some("cat"), 0), ("b.mp4", Some("dog"), 1)]);
    let jsonl = write(
        dir.path(),
        "m.jsonl",
        "\u{feff}{\"path\": \"a.mp4\", \"label\": 3}\n{\"path\": \"b.mp4\"}\n",
    );
    let s = Samples::from_manifest(&jsonl).unwrap();
    let rows: Vec<_> = s
        .iter()
        .map(|s| (s.video, s.label, s.label_index))
        .collect();
    assert_eq!(rows, [("a.mp4", Some("3"), 3), ("b.mp4", None, -1)]);
    let bad = write(
        dir.path(),
        "bad.jsonl",
        "\u{feff}{\"path\": \"a.mp4\"}\n{}\n",
    );
    assert!(matches!(
        Samples::from_manifest(&bad),
        Err(ManifestError::Parse { line: 2, .. })
    ));
}

/// Only a regular file of at most `MAX_MANIFEST_BYTES` is read, and a row's path must be one a file
/// could have: a FIFO waited for a writer for ever (every later reload behind it), a symlink to
/// /dev/zero grew the daemon until its allocator aborted it, and binary junk (NUL bytes) became samples.
#[test]
fn a_manifest_that_is_no_text_file_or_too_big_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |p: &Path| match Samples::from_manifest(p) {
        Err(e) => e.to_string(),
        Ok(s) => panic!("{}: {} samples", p.display(), s.len()),
    };
    let fifo = dir.path().join("fifo.csv");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let start = std::time::Instant::now();
    assert!(refused(&fifo).contains("not a regular file"));
    assert!(
        start.elapsed() < std::time::Duration::from_secs(2),
        "waited for a writer"
    );
    let zero = dir.path().join("zero.csv");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    assert!(refused(&zero).contains("not a regular file"));
    assert!(refused(dir.path()).contains("not a regular file"));
    // Over the bound (a sparse file: nothing is written).
    let big = dir.path().join("big.csv");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(MAX_MANIFEST_BYTES + 1)
        .unwrap();
    assert!(
        refused(&big).contains("over the 1024 MiB"),
        "{}",
        refused(&big)
    );
    // Junk: NUL bytes in a path, a path longer than any.
    let junk = write(
        dir.path(),
        "junk.csv",
        &format!("{}\nok.mp4\n", "\0\u{ff}".repeat(1000)),
    );
    let e = refused(&junk);
    assert!(e.contains("line 1") && e.contains("NUL byte"), "{e}");
    assert!(e.contains("... (3000 bytes)"), "the path is cut: {e}");
    let long = write(
        dir.path(),
        "long.jsonl",
        &format!("{{\"path\": \"{}\"}}\n", "a".repeat(5000)),
    );
    let e = refused(&long);
    assert!(e.contains("5000 bytes long"), "{e}");
}
