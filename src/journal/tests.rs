use super::*;

/// Writes a slot file by hand (a torn or empty record).
fn write_raw(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

/// A fresh state directory (kept alive by the returned guard), its journal and one slot of it.
fn fresh_slot() -> (tempfile::TempDir, StateDir, Arc<Journal>, JournalSlot) {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let journal = recover(&state).unwrap().0.unwrap();
    let slot = journal.slot().unwrap();
    (dir, state, journal, slot)
}

fn key(path: &str, size: u64) -> FileKey {
    FileKey {
        path: PathBuf::from(path),
        size,
        mtime_ns: 1_700_000_000_123_456_789,
    }
}

#[test]
fn files_left_busy_are_quarantined_until_they_change_and_the_set_persists() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let (journal, q) = recover(&state).unwrap();
    let journal = journal.unwrap();
    assert!(q.is_empty());
    let poison = key("/data/bad\nname.mp4", 10);
    let good = key("/data/good.mp4", 20);
    let stuck = key("/data/stuck.mp4", 30);
    let a = journal.slot().unwrap();
    let b = journal.slot().unwrap();
    let c = journal.slot().unwrap();
    // a finished cleanly, b died inside, c was abandoned past its deadline.
    a.enter(&good, true).unwrap();
    a.leave();
    b.enter(&good, true).unwrap();
    b.leave();
    b.enter(&poison, true).unwrap();
    c.enter(&stuck, true).unwrap();
    c.mark_stalled();
    // The process dies: nothing is dropped.
    std::mem::forget((a, b, c));
    drop(journal);

    let (journal, q) = recover(&state).unwrap();
    assert_eq!(q.len(), 1);
    // While this process holds the journal, another gets none and leaves its records alone.
    let (other, seen) = recover(&state).unwrap();
    assert!(other.is_none());
    assert_eq!(seen.len(), 1);
    assert_eq!(q.check(&poison).map(|x| x.key), Some(poison.clone()));
    assert_eq!(q.check(&good), None);
    assert_eq!(q.check(&stuck), None);
    // The journal starts empty again.
    let names: Vec<_> = std::fs::read_dir(state.path(JOURNAL_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["lock"]);
    drop(journal);

    // A restart with an empty journal keeps the quarantine (persisted).
    let (_journal, q) = recover(&state).unwrap();
    assert!(q.check(&poison).is_some());
    // The file changes: it leaves the quarantine, for good.
    let touched = FileKey {
        mtime_ns: poison.mtime_ns + 1,
        ..poison.clone()
    };
    assert_eq!(q.check(&touched), None);
    assert_eq!(q.check(&poison), None);
    let (_journal, q) = recover(&state).unwrap();
    assert!(q.is_empty());
}

#[test]
fn clearing_removes_entries_from_memory_and_the_file_together() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let (_, q) = recover(&state).unwrap();
    let (a, b, c) = (key("/d/a.mp4", 1), key("/d/b.mp4", 2), key("/d/c.mp4", 3));
    for k in [&a, &b, &c] {
        q.add(Quarantined {
            key: k.clone(),
            since: 7,
            why: "test".into(),
        });
    }
    // An unknown path clears nothing.
    let missing = PathBuf::from("/d/none.mp4");
    let err = q.clear(&[a.path.clone(), missing.clone()], false);
    assert_eq!(err.err().map(|e| e.ok()), Some(Some(missing)));
    assert_eq!(q.len(), 3);
    let cleared = q.clear(std::slice::from_ref(&b.path), false).unwrap();
    assert_eq!(cleared.iter().map(|x| &x.key).collect::<Vec<_>>(), [&b]);
    let paths = |q: &Quarantine| q.list().into_iter().map(|x| x.key).collect::<Vec<_>>();
    assert_eq!(paths(&q), [a.clone(), c.clone()]);
    let on_disk = Quarantine::read_persisted(dir.path()).unwrap().unwrap();
    assert_eq!(paths(&on_disk), [a.clone(), c.clone()]);
    assert_eq!(on_disk.list()[0].since, 7);
    assert_eq!(q.clear(&[], true).unwrap().len(), 2);
    assert!(q.is_empty());
    assert!(Quarantine::read_persisted(dir.path())
        .unwrap()
        .unwrap()
        .is_empty());
    assert!(Quarantine::read_persisted(&dir.path().join("no"))
        .unwrap()
        .is_none());
}

#[test]
fn a_clean_exit_and_torn_records_quarantine_nothing() {
    let (_dir, state, journal, a) = fresh_slot();
    a.enter(&key("/x.mp4", 1), false).unwrap();
    // Clean shutdown with a thread still inside (stuck): cleared.
    journal.clear_all();
    std::mem::forget(a);
    drop(journal);
    write_raw(&state.path("journal/slot-9"), b"B 12 34 zz");
    write_raw(&state.path("journal/slot-8"), b"");
    let (_, q) = recover(&state).unwrap();
    assert!(q.is_empty());
    // A quarantine file that does not parse (a hand edit's trailing comma) is an error to the offline
    // listing, and the daemon moves it aside, never overwriting it: its entries are not lost.
    let hand_edited = b"{\"version\": 1, \"files\": [],}";
    state.write_atomic(QUARANTINE_FILE, hand_edited).unwrap();
    let Err(err) = Quarantine::read_persisted(state.root()) else {
        panic!("a file that does not parse listed as a quarantine");
    };
    assert!(err.to_string().contains("not a quarantine file"), "{err}");
    let (_, q) = recover(&state).unwrap();
    assert!(q.is_empty());
    let aside: Vec<_> = std::fs::read_dir(state.root())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("quarantine.json.unreadable-")
        })
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(std::fs::read(aside[0].path()).unwrap(), hand_edited);
}

#[test]
fn only_runs_that_can_take_the_host_down_wait_for_the_disk() {
    let (_dir, state, journal, slot) = fresh_slot();
    let record = || std::fs::read(state.path("journal/slot-0")).unwrap();
    let (cpu, gpu) = (key("/data/cpu.mp4", 1), key("/data/gpu.mp4", 2));
    let device = || {
        let mut r = gpu.record();
        r[0] = b'D';
        r
    };
    // CPU runs: written, never synced.
    for _ in 0..3 {
        slot.enter(&cpu, false).unwrap();
        assert_eq!(record(), cpu.record());
        slot.leave();
    }
    assert_eq!(journal.syncs(), 0);
    // A device run syncs once per new file, not again for the same file.
    slot.enter(&gpu, true).unwrap();
    slot.leave();
    slot.enter(&gpu, true).unwrap();
    assert_eq!(journal.syncs(), 1);
    assert_eq!(record(), device());
    slot.leave();
    // A CPU run in between rewrites the record: the device run after it writes and syncs its own
    // again instead of flipping the state byte of the CPU run's record.
    slot.enter(&cpu, false).unwrap();
    slot.leave();
    slot.enter(&gpu, true).unwrap();
    assert_eq!(journal.syncs(), 2);
    assert_eq!(record(), device());
    // The process dies inside the device run: the file is quarantined at the next start.
    std::mem::forget(slot);
    drop(journal);
    let (_, q) = recover(&state).unwrap();
    assert_eq!(q.check(&gpu).map(|x| x.key), Some(gpu.clone()));
    assert_eq!(q.check(&cpu), None);
}

/// A process killed inside a CPU run (no crash recorded) makes the file a suspect, served as before; a
/// second death inside it quarantines it, unless a run of it finished in between.
#[test]
fn a_kill_inside_a_cpu_run_makes_a_suspect_and_a_second_one_quarantines_it() {
    let (dir, state, journal, slot) = fresh_slot();
    let (done, poison, innocent) = (
        key("/data/done.mp4", 1),
        key("/data/poison.mp4", 2),
        key("/data/innocent.mp4", 3),
    );
    slot.enter(&done, false).unwrap();
    slot.leave();
    slot.enter(&poison, false).unwrap();
    let other = journal.slot().unwrap();
    other.enter(&innocent, false).unwrap();
    assert_eq!(journal.syncs(), 0);
    std::mem::forget((slot, other));
    drop(journal);

    let (journal, q) = recover(&state).unwrap();
    assert!(q.is_empty());
    let keys = |v: Vec<Quarantined>| v.into_iter().map(|x| x.key).collect::<Vec<_>>();
    assert_eq!(keys(q.suspects()), [innocent.clone(), poison.clone()]);
    assert_eq!(q.check(&poison), None);
    // A run of the innocent file finishes: no longer a suspect, on disk too.
    let journal = journal.unwrap();
    let slot = journal.slot().unwrap();
    slot.enter(&innocent, false).unwrap();
    slot.leave();
    assert_eq!(keys(q.suspects()), std::slice::from_ref(&poison));
    let on_disk = Quarantine::read_persisted(dir.path()).unwrap().unwrap();
    assert_eq!(keys(on_disk.suspects()), std::slice::from_ref(&poison));
    // Killed inside both again: the suspect is quarantined, the other becomes a suspect.
    slot.enter(&poison, false).unwrap();
    let other = journal.slot().unwrap();
    other.enter(&innocent, false).unwrap();
    std::mem::forget((slot, other));
    drop(journal);
    let (_, q) = recover(&state).unwrap();
    assert_eq!(keys(q.list()), std::slice::from_ref(&poison));
    assert!(q.list()[0].why.contains("twice"), "{:?}", q.list());
    assert_eq!(keys(q.suspects()), std::slice::from_ref(&innocent));
}

/// Several threads inside one file when the daemon is killed are one death, not several: the file
/// becomes a suspect, not quarantined (a kill while two threads decoded a popular file used to count
/// twice and quarantine it at once). A crash record among them still quarantines it.
#[test]
fn threads_inside_one_file_at_a_kill_count_as_one_death() {
    let (_dir, state, journal, slot) = fresh_slot();
    let popular = key("/data/popular.mp4", 5);
    slot.enter(&popular, false).unwrap();
    let other = journal.slot().unwrap();
    other.enter(&popular, false).unwrap();
    let third = journal.slot().unwrap();
    third.enter(&popular, false).unwrap();
    std::mem::forget((slot, other, third));
    drop(journal);
    let (journal, q) = recover(&state).unwrap();
    assert!(q.is_empty(), "one kill quarantined: {:?}", q.list());
    let suspects: Vec<FileKey> = q.suspects().into_iter().map(|x| x.key).collect();
    assert_eq!(suspects, std::slice::from_ref(&popular));
    // A run of it finishes: served and suspected no more.
    let journal = journal.unwrap();
    let slot = journal.slot().unwrap();
    slot.enter(&popular, false).unwrap();
    slot.leave();
    assert!(q.suspects().is_empty());
    // Killed again with two threads inside it: one death again, a suspect again.
    slot.enter(&popular, false).unwrap();
    let other = journal.slot().unwrap();
    other.enter(&popular, false).unwrap();
    std::mem::forget((slot, other));
    drop(journal);
    let (_, q) = recover(&state).unwrap();
    assert!(q.is_empty(), "{:?}", q.list());
    assert_eq!(q.suspects().len(), 1);
}

/// The record the crash handler marks (`C`) quarantines its file at once; the files other threads were
/// inside were bystanders: neither quarantined nor suspects.
#[test]
fn a_crash_quarantines_the_crashing_file_only() {
    let (_dir, state, journal, slot) = fresh_slot();
    let (poison, bystander, device) = (
        key("/data/poison.mp4", 1),
        key("/data/bystander.mp4", 2),
        key("/data/gpu.mp4", 3),
    );
    slot.enter(&poison, false).unwrap();
    let (b, c) = (journal.slot().unwrap(), journal.slot().unwrap());
    b.enter(&bystander, false).unwrap();
    c.enter(&device, true).unwrap();
    // What the handler writes on the crashing thread.
    std::fs::File::options()
        .write(true)
        .open(state.path("journal/slot-0"))
        .unwrap()
        .write_all_at(b"C", 0)
        .unwrap();
    std::mem::forget((slot, b, c));
    drop(journal);
    let (_, q) = recover(&state).unwrap();
    let list = q.list();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].key, poison);
    assert!(list[0].why.contains("crashed"), "{list:?}");
    assert!(q.suspects().is_empty());
}

/// What an operator lists is what is refused: an entry whose file has changed since (as a request for it
/// would find) leaves the quarantine when it is listed, on disk too; one whose file cannot be read now
/// stays.
#[test]
fn a_changed_file_leaves_the_listing() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let (_journal, q) = recover(&state).unwrap();
    let video = dir.path().join("v.mp4");
    std::fs::write(&video, b"0123456789").unwrap();
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let set_mtime = |t| {
        std::fs::File::options()
            .write(true)
            .open(&video)
            .unwrap()
            .set_modified(t)
            .unwrap()
    };
    set_mtime(when);
    let here = FileKey {
        path: video.clone(),
        size: 10,
        mtime_ns: 1_700_000_000 * 1_000_000_000,
    };
    let gone = key("/nonexistent/x.mp4", 3);
    for k in [&here, &gone] {
        q.add(Quarantined {
            key: k.clone(),
            since: 1,
            why: "test".into(),
        });
    }
    q.forget_changed();
    assert_eq!(q.len(), 2, "unchanged and unreadable files stay");
    set_mtime(when + std::time::Duration::from_secs(5));
    assert!(!unchanged(&q.list()[1]));
    q.forget_changed();
    let paths = |q: &Quarantine| q.list().into_iter().map(|x| x.key).collect::<Vec<_>>();
    assert_eq!(paths(&q), std::slice::from_ref(&gone));
    let on_disk = Quarantine::read_persisted(dir.path()).unwrap().unwrap();
    assert_eq!(paths(&on_disk), [gone]);
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo reads it only.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {path:?}"
    );
}

/// `recover` on a thread, answered within 20 s (or the test fails rather than hangs).
fn recover_soon(state: &StateDir) -> std::io::Result<(Option<Arc<Journal>>, Arc<Quarantine>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let state = state.clone();
    std::thread::spawn(move || {
        let _ = tx.send(recover(&state));
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("recover blocked on a FIFO in the state directory")
}

/// A FIFO at a journal slot or at the quarantine file blocked `recover`, so the daemon never bound its
/// socket, forever and without a log line. They are now read as the unreadable files they are: the slot
/// is ignored and removed, the quarantine file moved aside, and the journal works.
#[test]
fn fifos_in_the_state_directory_block_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    std::fs::create_dir_all(state.path(JOURNAL_DIR)).unwrap();
    mkfifo(&state.path("journal/slot-0"));
    mkfifo(&state.path(QUARANTINE_FILE));
    let (journal, q) = recover_soon(&state).unwrap();
    let journal = journal.expect("a journal");
    assert!(q.is_empty());
    assert!(
        !state.path("journal/slot-0").exists(),
        "the FIFO slot is removed"
    );
    let slot = journal.slot().unwrap();
    slot.enter(&key("/data/a.mp4", 1), true).unwrap();
    slot.leave();
    drop(slot);
    drop(journal);

    // A FIFO where the lock goes: no journal (as for any lock that cannot be taken), but no hang.
    let other = tempfile::tempdir().unwrap();
    let state = StateDir::open(other.path()).unwrap();
    std::fs::create_dir_all(state.path(JOURNAL_DIR)).unwrap();
    mkfifo(&state.path("journal/lock"));
    let err = recover_soon(&state).err().expect("an error");
    assert!(err.to_string().contains("FIFO"), "{err}");
}

/// A directory at a slot's name made `recover` fail (remove_file of a directory), so the daemon ran
/// without a crash journal, and a new slot could not take that name. It is now ignored like any foreign
/// entry: logged, removed only when empty (a tree is never deleted), and slots take other names.
#[test]
fn a_directory_at_a_slot_name_is_ignored_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    std::fs::create_dir_all(state.path("journal/slot-0")).unwrap();
    std::fs::write(state.path("journal/slot-0/kept"), b"someone's file").unwrap();
    std::fs::create_dir_all(state.path("journal/slot-1")).unwrap();
    let (journal, q) = recover_soon(&state).unwrap();
    let journal = journal.expect("a journal");
    assert!(q.is_empty());
    assert_eq!(
        std::fs::read(state.path("journal/slot-0/kept")).unwrap(),
        b"someone's file"
    );
    assert!(
        !state.path("journal/slot-1").exists(),
        "the empty directory is removed"
    );
    // Slot 0's name is held: the slot is journal/slot-1, and it records.
    let slot = journal.slot().unwrap();
    slot.enter(&key("/data/a.mp4", 1), false).unwrap();
    let record = std::fs::read(state.path("journal/slot-1")).unwrap();
    assert_eq!(
        FileKey::parse_record(&record),
        Some((b'B', key("/data/a.mp4", 1)))
    );
    slot.leave();
}
