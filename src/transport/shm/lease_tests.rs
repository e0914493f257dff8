//! Slots as lease tokens: a release sent twice, or late, frees nothing of the slot's next holder.

use super::arena::index;
use super::tests::{me, registry};
use super::*;

#[tokio::test]
async fn a_release_sent_twice_or_late_frees_nothing_of_the_slots_next_holder() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), Duration::from_secs(60));
    // One stream: batch 1's slot released, taken again by batch 3; batch 1's release arrives again.
    let arena = reg.stream_arena(4, 2, &me()).unwrap();
    let first = arena.acquire().await;
    let held = arena.acquire().await;
    reg.release(arena.name(), &[first], &me()).unwrap();
    let third = arena.acquire().await;
    assert_eq!(index(third), index(first));
    reg.release(arena.name(), &[first], &me()).unwrap();
    assert_eq!(arena.try_acquire(), None, "both slots still held");
    // An unknown token of a slot that exists is not an error either (a lease count from the future
    // is as stale as one from the past), and frees nothing.
    reg.release(arena.name(), &[third + (1 << 8)], &me())
        .unwrap();
    assert_eq!(arena.try_acquire(), None);
    reg.release(arena.name(), &[third, held], &me()).unwrap();
    assert_eq!(arena.try_acquire().map(index), Some(0));
    drop(arena);

    // A stream arena pooled at its stream's end and lent to the same client's next stream: the old
    // stream's last release, repeated, leaves the new stream's slot taken.
    let old = reg.stream_arena(100, 1, &me()).unwrap();
    let name = old.name().to_owned();
    let s = old.acquire().await;
    reg.release(&name, &[s], &me()).unwrap();
    reg.retire(old);
    let new = reg.stream_arena(100, 1, &me()).unwrap();
    assert_eq!(new.name(), name, "the arena is lent");
    let t = new.acquire().await;
    let r = new.write(t, &[5; 100]).unwrap();
    reg.release(&name, &[s], &me()).unwrap();
    assert_eq!(
        new.try_acquire(),
        None,
        "the new stream's slot is still held"
    );
    reg.release(&name, &[r.slot], &me()).unwrap();
    assert!(new.try_acquire().is_some());
    drop(new);

    // A GetClips reply arena lent to the client's next reply: the first reply's release, repeated,
    // neither frees the second reply's slot nor sends its arena to the pool, so a third reply gets
    // another arena and the second reply's bytes stay as written.
    let fill = |v: u8| {
        reg.one_shot_with(1000, true, &me(), |b| {
            b.fill(v);
            Ok::<_, ShmError>(())
        })
        .unwrap()
        .1
    };
    let a = fill(1);
    reg.release(&a.arena, &[a.slot], &me()).unwrap();
    let b = fill(2);
    assert_eq!(b.arena, a.arena, "lent");
    assert_ne!(b.slot, a.slot, "a new lease, a new token");
    reg.release(&a.arena, &[a.slot], &me()).unwrap();
    assert_eq!(
        reg.spare_arenas(),
        0,
        "the second reply's arena is not spare"
    );
    let c = fill(3);
    assert_ne!(c.arena, b.arena);
    assert_eq!(std::fs::read(&b.path).unwrap()[..1000], [2; 1000]);
    // Its own release still works once, and sends the arena to the pool.
    reg.release(&b.arena, &[b.slot], &me()).unwrap();
    assert_eq!(reg.spare_arenas(), 1);
}
