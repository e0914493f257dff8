//! Budgets under concurrency: what one client's requests at once may hold.

use super::tests::me;
use super::*;

/// Replies taken at once by one client's concurrent requests stay within its budget: each admission saw
/// the others' arenas only once they were registered, so 16 at once overshot `--client-shm-bytes` by up
/// to 15 arenas (probe R2: 2 to 8 MiB over a 1 GiB limit).
#[test]
fn concurrent_replies_stay_within_the_clients_budget() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Arc::new(
        ShmRegistry::new(
            dir.path().into(),
            Duration::from_secs(60),
            ShmBudget {
                total: 64 * SPARE_ROUND,
                per_client: 4 * SPARE_ROUND,
            },
        )
        .unwrap(),
    );
    for round in 0..20 {
        // Odd rounds lend pooled arenas: the last round's four, released.
        let reusable = round % 2 == 1;
        let start = Arc::new(std::sync::Barrier::new(16));
        let held: Vec<_> = (0..16)
            .map(|_| {
                let (reg, start) = (reg.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    reg.reserve_reply(SPARE_ROUND, reusable, &me()).ok()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        assert!(
            held.len() <= 4,
            "round {round}: {} replies of 1 MiB held under a 4 MiB budget",
            held.len()
        );
        for r in held {
            let r = reg.publish(&r, true).unwrap();
            reg.release(&r.arena, &[r.slot], &me()).unwrap();
        }
    }
}

/// A pooled arena lent to a client counts against its budget as a new one would: a client at its
/// budget was lent spare arenas past it.
#[test]
fn a_client_at_its_budget_is_lent_no_spare_arena() {
    let dir = tempfile::tempdir().unwrap();
    let reg = ShmRegistry::new(
        dir.path().into(),
        Duration::from_secs(60),
        ShmBudget {
            total: 64 * SPARE_ROUND,
            per_client: 4 * SPARE_ROUND,
        },
    )
    .unwrap();
    // Two pooled arenas, then the whole budget held.
    let two: Vec<_> = (0..2)
        .map(|_| reg.reserve_reply(SPARE_ROUND, true, &me()).unwrap())
        .collect();
    for r in two {
        let r = reg.publish(&r, true).unwrap();
        reg.release(&r.arena, &[r.slot], &me()).unwrap();
    }
    assert_eq!(reg.spare_arenas(), 2);
    let held: Vec<_> = (0..4)
        .map(|_| reg.reserve_reply(SPARE_ROUND, false, &me()).unwrap())
        .collect();
    let more = reg.reserve_reply(SPARE_ROUND, true, &me());
    assert!(
        matches!(more, Err(ShmError::Budget { .. })),
        "a fifth arena lent past the budget"
    );
    assert_eq!(reg.spare_arenas(), 2, "the pool keeps its arenas");
    drop(held);
}
