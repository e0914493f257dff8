//! The registry's and arenas' unit tests.

use super::arena::{free_bytes, index};
use super::*;

pub(super) fn registry(dir: &Path, ttl: Duration) -> ShmRegistry {
    ShmRegistry::new(
        dir.into(),
        ttl,
        ShmBudget {
            total: usize::MAX / 2,
            per_client: usize::MAX / 2,
        },
    )
    .unwrap()
}

pub(super) fn me() -> Peer {
    Peer::local()
}

#[tokio::test]
async fn slots_are_reused_only_after_release_and_files_go_with_their_arena() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    let arena = reg.stream_arena(4, 2, &me()).unwrap();
    let path = reg.dir().join(arena.name());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8);
    let a = arena.acquire().await;
    let b = arena.acquire().await;
    let ra = arena.write(a, &[1, 2, 3, 4]).unwrap();
    arena.write(b, &[5, 6]).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[ra.offset as usize..][..4], &[1, 2, 3, 4]);
    assert!(matches!(
        arena.write(a, &[0; 5]),
        Err(ShmError::TooLarge { .. })
    ));
    // Both slots taken: a third acquire waits until a release.
    let waiter = {
        let arena = arena.clone();
        tokio::spawn(async move { arena.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished());
    reg.release(arena.name(), &[b], &me()).unwrap();
    let again = waiter.await.unwrap();
    assert_eq!(index(again), index(b));
    assert_ne!(again, b, "a new lease of the slot, a new token");
    assert_eq!(reg.open_arenas(), 1);
    drop(arena);
    assert!(!path.exists(), "file removed with its arena");
    assert_eq!(reg.open_arenas(), 0);

    let r = reg.one_shot(&[9; 10], &me()).unwrap();
    assert_eq!(std::fs::read(&r.path).unwrap(), vec![9; 10]);
    reg.release(&r.arena, &[0], &me()).unwrap();
    assert!(!r.path.exists());
    assert!(matches!(
        reg.release(&r.arena, &[0], &me()),
        Err(ShmError::UnknownArena(_))
    ));
}

#[test]
fn released_reusable_replies_lend_their_arena_to_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    let fill = |reg: &ShmRegistry, n: usize, v: u8, reusable: bool| {
        reg.one_shot_with(n, reusable, &me(), |b| {
            b.fill(v);
            Ok::<_, ShmError>(())
        })
        .unwrap()
        .1
    };
    let a = fill(&reg, 1000, 1, true);
    // Not released yet: a second reply gets its own arena.
    let b = fill(&reg, 1000, 2, true);
    assert_ne!(a.arena, b.arena);
    reg.release(&a.arena, &[0], &me()).unwrap();
    assert!(a.path.exists(), "a released reusable arena is kept");
    assert_eq!(reg.open_arenas(), 2);
    // The next reply that fits takes it, with its own bytes.
    let c = fill(&reg, 900, 3, true);
    assert_eq!(c.arena, a.arena);
    let bytes = std::fs::read(&c.path).unwrap();
    assert_eq!(&bytes[..900], &[3; 900][..]);
    // Released twice is unknown, as before.
    reg.release(&c.arena, &[c.slot], &me()).unwrap();
    assert!(matches!(
        reg.release(&c.arena, &[c.slot], &me()),
        Err(ShmError::UnknownArena(_))
    ));
    // A reply far larger than every spare gets a new arena; a non-reusable reply never takes a
    // spare, and its arena goes with its release.
    let big = fill(&reg, 3 * SPARE_ROUND, 4, true);
    assert_ne!(big.arena, a.arena);
    let plain = fill(&reg, 10, 5, false);
    assert_ne!(plain.arena, a.arena);
    reg.release(&plain.arena, &[0], &me()).unwrap();
    assert!(!plain.path.exists());
    // The pool is bounded.
    for i in 0..SPARE_ARENAS + 2 {
        let r = fill(&reg, (i + 1) * SPARE_ROUND + 1, 6, true);
        reg.release(&r.arena, &[0], &me()).unwrap();
    }
    assert!(reg.spare.lock().len() <= SPARE_ARENAS);
}

#[test]
fn the_spare_pool_follows_the_replies_in_flight_within_half_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    let fill = |reg: &ShmRegistry, v: u8| {
        reg.one_shot_with(1000, true, &me(), |b| {
            b.fill(v);
            Ok::<_, ShmError>(())
        })
        .unwrap()
        .1
    };
    // A client pipelining 10 reusable replies: all 10 arenas are kept once released...
    let n = SPARE_ARENAS + 6;
    let first: Vec<ShmRef> = (0..n).map(|i| fill(&reg, i as u8)).collect();
    for r in &first {
        reg.release(&r.arena, &[0], &me()).unwrap();
    }
    assert_eq!(reg.spare_arenas(), n, "{:?}", reg.spare_bounds());
    // ... and the next 10 in flight take them all: no new file.
    let second: Vec<ShmRef> = (0..n).map(|i| fill(&reg, 100 + i as u8)).collect();
    let mut old: Vec<&str> = first.iter().map(|r| r.arena.as_str()).collect();
    let mut new: Vec<&str> = second.iter().map(|r| r.arena.as_str()).collect();
    old.sort();
    new.sort();
    assert_eq!(old, new, "every reply of the second round reused an arena");
    for (i, r) in second.iter().enumerate() {
        assert_eq!(
            std::fs::read(&r.path).unwrap()[..1000],
            [100 + i as u8; 1000][..]
        );
    }

    // Half the budget bounds the pool's bytes: 4 MiB of budget keeps at most 2 MiB of 1 MiB arenas.
    let small = tempfile::tempdir().unwrap();
    let reg = ShmRegistry::new(
        small.path().into(),
        Duration::from_secs(60),
        ShmBudget {
            total: 4 * SPARE_ROUND,
            per_client: 4 * SPARE_ROUND,
        },
    )
    .unwrap();
    let held: Vec<ShmRef> = (0..4).map(|i| fill(&reg, i)).collect();
    assert_eq!(reg.spare_bounds(), (SPARE_ARENAS, 2 * SPARE_ROUND));
    for r in &held {
        reg.release(&r.arena, &[0], &me()).unwrap();
    }
    assert_eq!(reg.spare_arenas(), 2);
}

#[test]
fn spare_arenas_expire_unused() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_millis(50));
    let (_, r) = reg
        .one_shot_with(10, true, &me(), |_| Ok::<_, ShmError>(()))
        .unwrap();
    reg.release(&r.arena, &[0], &me()).unwrap();
    assert!(r.path.exists());
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(reg.open_arenas(), 0);
    assert!(!r.path.exists());
}

#[test]
fn stale_instances_go_and_live_ones_stay_whatever_their_pids() {
    let dir = tempfile::tempdir().unwrap();
    // Older layout: pid 0 is never a user process; our own pid is alive.
    std::fs::write(dir.path().join("vserve-0-abc"), b"x").unwrap();
    let mine = format!("vserve-{}-abc", std::process::id());
    std::fs::write(dir.path().join(&mine), b"x").unwrap();
    std::fs::write(dir.path().join("other-file"), b"x").unwrap();
    // A live instance whose pid says nothing (as in a container where every daemon is pid 1): it
    // holds its lock, so it stays with its arenas.
    let live = registry(dir.path(), Duration::from_secs(60));
    let live_arena = live.stream_arena(8, 1, &me()).unwrap();
    // A crashed instance with the same pid in its name: its lock is free.
    let dead = dir.path().join("vserve-1-0123456789abcdef0123456789abcdef");
    std::fs::create_dir(&dead).unwrap();
    std::fs::write(dead.join(".lock"), b"").unwrap();
    std::fs::write(dead.join("vserve-0123"), b"batch").unwrap();
    // Directories that are not instances are never touched: another program's, another daemon's
    // --shm-dir inside this one, an instance name without its lock.
    let foreign = [
        "vserve-jobA",
        "vserve-test-xyz",
        "vserve-2-fedcba9876543210fedcba9876543210",
    ];
    for f in foreign {
        std::fs::create_dir(dir.path().join(f)).unwrap();
        std::fs::write(dir.path().join(f).join("data"), b"keep").unwrap();
    }
    // An instance whose daemon exited having removed its lock but not an arena a stuck decode thread
    // still held (the daemon's pid, u32::MAX - 1, runs nothing).
    let lockless = dir.path().join(format!(
        "vserve-{}-0123456789abcdef0123456789abcdee",
        u32::MAX - 1
    ));
    std::fs::create_dir(&lockless).unwrap();
    std::fs::write(lockless.join("vserve-4567"), b"reply").unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    assert_eq!(reg.remove_stale(), 3);
    assert!(!dead.exists());
    assert!(!lockless.exists());
    assert!(!dir.path().join("vserve-0-abc").exists());
    assert!(dir.path().join(&mine).exists());
    assert!(dir.path().join("other-file").exists());
    for f in foreign {
        assert!(dir.path().join(f).join("data").exists(), "{f} removed");
    }
    assert!(
        live.dir().join(live_arena.name()).exists(),
        "a running instance's arena stays"
    );
    // Dropping a registry removes its directory, with the arenas still referenced elsewhere (a reply
    // a decode thread left at shutdown): their files go, their mappings stay usable.
    let d = reg.dir().to_path_buf();
    let held = Arc::new(reserve(&reg));
    drop(reg);
    assert!(!d.exists());
    // SAFETY: nothing else touches the reply's bytes.
    unsafe { held.with_bytes(|b| b.fill(7)) };
    drop(held);
}

fn reserve(reg: &ShmRegistry) -> PendingReply {
    reg.reserve_reply(4096, false, &me()).unwrap()
}

#[test]
fn only_the_owner_releases_and_bad_slots_free_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    let owner = Peer::unix(Some(std::process::id() as i32), 0);
    let other = Peer::tcp("10.0.0.9".parse().unwrap());
    let arena = reg.stream_arena(4, 2, &owner).unwrap();
    let (a, b) = (arena.try_acquire().unwrap(), arena.try_acquire().unwrap());
    let e = reg.release(arena.name(), &[a], &other).unwrap_err();
    assert!(matches!(e, ShmError::NotOwner { .. }), "{e:?}");
    assert!(
        arena.try_acquire().is_none(),
        "a foreign release freed nothing"
    );
    // A valid and an out-of-range slot: nothing is freed.
    let e = reg.release(arena.name(), &[a, 7], &owner).unwrap_err();
    assert!(matches!(e, ShmError::BadSlot { slot: 7, .. }), "{e:?}");
    assert!(arena.try_acquire().is_none());
    reg.release(arena.name(), &[a, b], &owner).unwrap();
    assert_eq!(arena.try_acquire().map(index), Some(0));
    // Replies too.
    let r = reg.one_shot(&[1; 8], &owner).unwrap();
    assert!(matches!(
        reg.release(&r.arena, &[0], &other),
        Err(ShmError::NotOwner { .. })
    ));
    assert!(r.path.exists());
    reg.release(&r.arena, &[0], &owner).unwrap();
    assert!(!r.path.exists());
}

#[test]
fn budgets_refuse_with_the_numbers_and_give_back_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let reg = ShmRegistry::new(
        dir.path().into(),
        Duration::from_secs(60),
        ShmBudget {
            total: 1000,
            per_client: 600,
        },
    )
    .unwrap();
    let (x, y) = (
        Peer::tcp("10.0.0.1".parse().unwrap()),
        Peer::tcp("10.0.0.2".parse().unwrap()),
    );
    let a = reg.stream_arena(500, 1, &x).unwrap();
    let e = reg.stream_arena(200, 1, &x).unwrap_err();
    assert!(
        matches!(
            e,
            ShmError::Budget {
                needed: 200,
                used: 500,
                limit: 600,
                ..
            }
        ),
        "{e:?}"
    );
    let b = reg.stream_arena(400, 1, &y).unwrap();
    let e = reg.stream_arena(200, 1, &y).unwrap_err();
    assert!(matches!(e, ShmError::Budget { limit: 1000, .. }), "{e:?}");
    assert_eq!(reg.bytes_in_use(), 900);
    drop(a);
    drop(b);
    assert_eq!(reg.bytes_in_use(), 0);
    reg.stream_arena(600, 1, &x).unwrap();
}

#[test]
fn a_full_shm_directory_is_an_error_not_a_fault() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    let free = free_bytes(reg.dir()).unwrap();
    // A tebibyte past the free space: with a mebibyte, files other tests removed meanwhile let it pass the
    // check, and its fallocate filled the disk under every test running beside it until it failed.
    let e = reg
        .stream_arena(free as usize + (1 << 40), 1, &me())
        .unwrap_err();
    assert!(matches!(e, ShmError::NoSpace { .. }), "{e:?}");
    assert_eq!(reg.open_arenas(), 0);
    assert_eq!(
        std::fs::read_dir(reg.dir()).unwrap().count(),
        1,
        "only .lock"
    );
}

#[test]
fn the_reaper_drops_what_exited_clients_left() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(3600));
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let client = Peer::unix(Some(child.id() as i32), 0);
    let reply = reg.one_shot(&[5; 16], &client).unwrap();
    let arena = reg.stream_arena(4, 2, &client).unwrap();
    let slot = arena.try_acquire().unwrap();
    arena.write(slot, &[1]).unwrap();
    let stream_file = reg.dir().join(arena.name());
    reg.retire(arena);
    assert_eq!(reg.reap(), 0, "alive: nothing reaped");
    assert!(reply.path.exists() && stream_file.exists());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(reg.reap(), 2);
    assert!(!reply.path.exists());
    assert!(!stream_file.exists());
    assert_eq!(reg.bytes_in_use(), 0);
}

#[tokio::test]
async fn a_release_with_a_bad_slot_frees_nothing_and_a_good_one_wakes_the_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    let arena = reg.stream_arena(4, 1, &me()).unwrap();
    let slot = arena.acquire().await;
    let waiter = {
        let arena = arena.clone();
        tokio::spawn(async move { arena.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let e = reg.release(arena.name(), &[slot, 7], &me()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("arena {:?} has no slot 7", arena.name())
    );
    // Nothing was freed: the waiter still waits, and the slot is still taken.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished());
    assert_eq!(arena.try_acquire(), None);
    // The good slot alone: freed, and the waiter wakes with it.
    reg.release(arena.name(), &[slot], &me()).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter woke")
        .unwrap();
    assert_eq!(index(got), index(slot));
}

#[test]
fn a_release_sent_as_its_owner_exits_is_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let owner = Peer::unix(Some(child.id() as i32), 1000);
    let arena = reg.stream_arena(4, 2, &owner).unwrap();
    let slot = arena.try_acquire().unwrap();
    // While the owner runs, a caller known only by the same uid is someone else.
    let by_uid = Peer::unix(None, 1000);
    assert!(matches!(
        reg.release(arena.name(), &[slot], &by_uid),
        Err(ShmError::NotOwner { .. })
    ));
    child.kill().unwrap();
    child.wait().unwrap();
    // Once it has exited, its last release (whose pid the daemon can no longer see) is answered OK and
    // changes nothing; another user is still refused.
    reg.release(arena.name(), &[slot], &by_uid).unwrap();
    assert_eq!(arena.try_acquire(), Some(1 - slot));
    assert_eq!(arena.try_acquire(), None, "slot {slot} was not freed");
    assert!(matches!(
        reg.release(arena.name(), &[slot], &Peer::unix(None, 1001)),
        Err(ShmError::NotOwner { .. })
    ));
    let r = reg.one_shot(&[1; 8], &owner).unwrap();
    reg.release(&r.arena, &[0], &by_uid).unwrap();
}

#[test]
fn replies_taken_before_decoding_count_in_their_owners_budget_until_published_or_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let reg = ShmRegistry::new(
        dir.path().into(),
        Duration::from_secs(60),
        ShmBudget {
            total: 10_000,
            per_client: 600,
        },
    )
    .unwrap();
    let x = Peer::tcp("10.0.0.1".parse().unwrap());
    let pending = std::sync::Arc::new(reg.reserve_reply(500, false, &x).unwrap());
    assert_eq!(reg.open_arenas(), 1);
    let e = reg.reserve_reply(200, false, &x).unwrap_err();
    assert!(
        matches!(
            e,
            ShmError::Budget {
                needed: 200,
                used: 500,
                ..
            }
        ),
        "{e:?}"
    );
    // Written through a sink, then published: the client's file holds the bytes.
    let sink = pending.sink(250, [(4, 250), (9, 0)]).unwrap();
    sink.take(4).unwrap().fill(4);
    sink.take(9).unwrap().fill(9);
    drop(sink);
    let r = reg.publish(&pending, false).unwrap();
    let bytes = std::fs::read(&r.path).unwrap();
    assert_eq!(&bytes[..250], &[9; 250]);
    assert_eq!(&bytes[250..500], &[4; 250]);
    assert_eq!(reg.open_arenas(), 1, "the published reply, counted once");
    reg.release(&r.arena, &[r.slot], &x).unwrap();
    drop(pending);
    assert_eq!(reg.open_arenas(), 0);
    // Taken and dropped unpublished (a cancelled request): gone, budget given back.
    let dropped = reg.reserve_reply(600, false, &x).unwrap();
    let path = dropped.arena.path.clone();
    assert!(path.exists());
    drop(dropped);
    assert!(!path.exists());
    assert_eq!(reg.open_arenas(), 0);
    assert_eq!(reg.bytes_in_use(), 0);
    reg.reserve_reply(600, false, &x).unwrap();
}

#[tokio::test]
async fn ended_streams_lend_their_arena_to_the_next_stream_of_their_shape() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    // Another process of this user (pid 1 is always running): its files are opened the same way.
    let first = Peer::unix(Some(1), euid);
    let mine = Peer::unix(Some(std::process::id() as i32), euid);
    let a = reg.stream_arena(100, 3, &first).unwrap();
    let b = reg.stream_arena(100, 3, &first).unwrap();
    let (a_name, b_name) = (a.name().to_owned(), b.name().to_owned());
    // `a` ends with every slot released: pooled at once, its file kept.
    let s = a.acquire().await;
    a.write(s, &[7; 100]).unwrap();
    reg.release(&a_name, &[s], &first).unwrap();
    reg.retire(a);
    assert_eq!(reg.spare_stream_arenas(), 1);
    assert!(reg.dir().join(&a_name).exists());
    // `b` ends with a slot the client still reads: retired, pooled once released.
    let held = b.acquire().await;
    b.write(held, &[8; 50]).unwrap();
    reg.retire(b);
    assert_eq!(reg.spare_stream_arenas(), 1);
    reg.release(&b_name, &[held], &first).unwrap();
    assert_eq!(reg.spare_stream_arenas(), 2);
    assert_eq!((reg.open_arenas(), reg.bytes_in_use()), (2, 600));

    // The next two streams of that shape take them: the same files, no new bytes.
    let c = reg.stream_arena(100, 3, &mine).unwrap();
    let d = reg.stream_arena(100, 3, &mine).unwrap();
    let mut names = vec![c.name().to_owned(), d.name().to_owned()];
    names.sort();
    let mut old = vec![a_name.clone(), b_name];
    old.sort();
    assert_eq!(names, old);
    assert_eq!((reg.spare_stream_arenas(), reg.bytes_in_use()), (0, 600));
    // Writes land in the file as in a new arena; only the new owner releases.
    let s = c.acquire().await;
    let r = c.write(s, &[9; 100]).unwrap();
    assert_eq!(
        std::fs::read(&r.path).unwrap()[r.offset as usize..][..100],
        [9; 100]
    );
    let e = reg.release(c.name(), &[s], &first).unwrap_err();
    assert!(matches!(e, ShmError::NotOwner { .. }), "{e:?}");
    reg.release(c.name(), &[s], &mine).unwrap();

    // Another shape, or a client that may not open the file: a new arena.
    let other_shape = reg.stream_arena(100, 4, &mine).unwrap();
    assert!(![c.name(), d.name()].contains(&other_shape.name()));
    reg.retire(c);
    assert_eq!(reg.spare_stream_arenas(), 1);
    let remote = reg
        .stream_arena(100, 3, &Peer::tcp("10.0.0.9".parse().unwrap()))
        .unwrap();
    assert_eq!(reg.spare_stream_arenas(), 1, "not lent across access modes");
    assert_eq!(reg.bytes_in_use(), 300 * 3 + 400);
    drop((d, other_shape, remote));
}

#[tokio::test]
async fn pooled_stream_arenas_stay_within_their_peak_and_the_budget_and_expire() {
    // Half the budget caps the pool: a 600-byte arena of a 1000-byte budget is not kept.
    let dir = tempfile::tempdir().unwrap();
    let budget = ShmBudget {
        total: 1000,
        per_client: 1000,
    };
    let reg = ShmRegistry::new(dir.path().into(), Duration::from_secs(60), budget).unwrap();
    let big = reg.stream_arena(200, 3, &me()).unwrap();
    let name = big.name().to_owned();
    reg.retire(big);
    assert_eq!(reg.spare_stream_arenas(), 0);
    assert!(!reg.dir().join(&name).exists());
    assert_eq!(reg.bytes_in_use(), 0);
    // A pooled arena goes when a new one would not fit the budget otherwise.
    let small = reg.stream_arena(100, 4, &me()).unwrap();
    reg.retire(small);
    assert_eq!((reg.spare_stream_arenas(), reg.bytes_in_use()), (1, 400));
    let other = reg.stream_arena(200, 4, &me()).unwrap();
    assert_eq!((reg.spare_stream_arenas(), reg.bytes_in_use()), (0, 800));
    drop(other);

    // The pool keeps no more than the stream arenas held at once: one stream at a time, one kept.
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_millis(50));
    for _ in 0..3 {
        let a = reg.stream_arena(10, 2, &me()).unwrap();
        reg.retire(a);
    }
    let b = reg.stream_arena(10, 3, &me()).unwrap();
    reg.retire(b);
    assert_eq!(
        reg.spare_stream_arenas(),
        1,
        "the 30-byte arena replaced the 20-byte one"
    );
    assert_eq!(reg.bytes_in_use(), 30);
    // Unused for the time to live: gone.
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(reg.open_arenas(), 0);
    assert_eq!(reg.bytes_in_use(), 0);
}

#[test]
fn spare_arenas_go_only_to_clients_of_the_same_user() {
    // Whoever held an arena knows its name: a spare must not carry another user's batches to it. Clients
    // without a uid (TCP) open files the same way, so the access mode alone would not tell them apart.
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    let a = Peer::tcp("10.0.0.9".parse().unwrap());
    let b = Peer::tcp("10.0.0.10".parse().unwrap());
    let reply = |who: &Peer| {
        reg.one_shot_with(1000, true, who, |buf| {
            buf.fill(1);
            Ok::<_, ShmError>(())
        })
        .unwrap()
        .1
    };
    let first = reply(&a);
    reg.release(&first.arena, &[0], &a).unwrap();
    assert_eq!(reg.spare_arenas(), 1);
    let other = reply(&b);
    assert_ne!(
        other.arena, first.arena,
        "another client's spare reply arena"
    );
    let stream = reg.stream_arena(100, 2, &a).unwrap();
    let name = stream.name().to_owned();
    reg.retire(stream);
    assert_eq!(reg.spare_stream_arenas(), 1);
    let s = reg.stream_arena(100, 2, &b).unwrap();
    assert_ne!(s.name(), name, "another client's pooled stream arena");
    assert_eq!(reg.spare_stream_arenas(), 1);

    // Two processes of one user share (the first test of each pool); two users do not, whatever the
    // access mode says.
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let (u, v) = (
        Peer::unix(Some(1), euid),
        Peer::unix(Some(std::process::id() as i32), euid.wrapping_add(1)),
    );
    let x = reg.stream_arena(50, 2, &u).unwrap();
    let name = x.name().to_owned();
    reg.retire(x);
    let y = reg.stream_arena(50, 2, &v).unwrap();
    assert_ne!(y.name(), name, "another user's pooled stream arena");
    let z = reg
        .stream_arena(50, 2, &Peer::unix(Some(std::process::id() as i32), euid))
        .unwrap();
    assert_eq!(z.name(), name, "the same user's pooled stream arena");

    // Loopback TCP clients the kernel names a user for: the same user shares, another does not.
    let tcp_user = |uid: u32| Peer {
        tcp_uid: Some(uid),
        ..Peer::tcp("127.0.0.1".parse().unwrap())
    };
    let x = reg.stream_arena(70, 2, &tcp_user(1000)).unwrap();
    let name = x.name().to_owned();
    reg.retire(x);
    let other = reg.stream_arena(70, 2, &tcp_user(1001)).unwrap();
    assert_ne!(other.name(), name, "another loopback user's pooled arena");
    let same = reg.stream_arena(70, 2, &tcp_user(1000)).unwrap();
    assert_eq!(same.name(), name, "the same loopback user's pooled arena");
}

/// This instance's directory removed under the daemon (a cleanup script): every later reply failed
/// INTERNAL until a restart, and the first was lent a pooled arena whose file had gone with it. The
/// directory is made again, locked (another instance's sweep leaves it alone), the pools are emptied,
/// and replies and streams are served; a directory at the path that is not this daemon's is refused.
#[test]
fn a_directory_removed_under_the_daemon_is_made_again() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    let fill = |v: u8| {
        reg.one_shot_with(1000, true, &me(), |b| {
            b.fill(v);
            Ok::<_, ShmError>(())
        })
        .map(|r| r.1)
    };
    let a = fill(1).unwrap();
    reg.release(&a.arena, &[0], &me()).unwrap();
    assert_eq!(reg.spare_arenas(), 1);
    // One reply pooled, one in flight when the directory goes.
    let in_flight = fill(9).unwrap();
    assert_eq!(in_flight.arena, a.arena, "the pooled arena is lent again");
    let pooled = fill(8).unwrap();
    reg.release(&pooled.arena, &[pooled.slot], &me()).unwrap();
    assert_eq!(reg.spare_arenas(), 1);
    std::fs::remove_dir_all(reg.dir()).unwrap();
    let b = fill(2).unwrap();
    assert_ne!(
        b.arena, pooled.arena,
        "a pooled arena whose file is gone was lent"
    );
    assert_eq!(std::fs::read(&b.path).unwrap()[..1000], [2u8; 1000][..]);
    // Released after the directory was made again, the in-flight one is not pooled either.
    reg.release(&in_flight.arena, &[in_flight.slot], &me())
        .unwrap();
    let c = fill(4).unwrap();
    assert_ne!(
        c.arena, in_flight.arena,
        "an arena whose file is gone was lent"
    );
    assert!(c.path.exists());
    let stream = reg.stream_arena(4096, 2, &me()).unwrap();
    assert!(reg.dir().join(&stream.name).exists());
    // The lock is held again: a sweep by another instance keeps the directory.
    let other = registry(dir.path(), Duration::from_secs(60));
    other.remove_stale();
    assert!(c.path.exists());
    // Something else at the path (here: our directory made writable by others) is not used.
    std::fs::set_permissions(reg.dir(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = fill(3).unwrap_err();
    assert!(
        err.to_string().contains("other than this daemon's own"),
        "{err}"
    );
}
