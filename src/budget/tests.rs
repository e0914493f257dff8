//! The in-flight budget's unit tests.

use super::*;

#[tokio::test]
async fn reserves_within_capacity_and_returns_on_drop() {
    let b = Budget::new(100, Duration::from_millis(10));
    let r1 = b.try_reserve(60, "a").await.unwrap();
    let mut r2 = b.try_reserve(40, "b").await.unwrap();
    assert_eq!(b.in_use(), 100);
    let e = b.try_reserve(1, "GetClips").await.unwrap_err();
    match e {
        Error::Overloaded(m) => assert_eq!(
            m,
            "GetClips needs 1 bytes (1 B), 100 of 100 in use (max-inflight-bytes)"
        ),
        other => panic!("{other:?}"),
    }
    r2.shrink_to(10);
    assert_eq!(b.in_use(), 70);
    drop(r1);
    assert_eq!(b.in_use(), 10);
    drop(r2);
    assert_eq!(b.in_use(), 0);
    assert_eq!(b.refusals(), 1);
}

#[tokio::test]
async fn more_than_the_whole_budget_is_refused_without_waiting() {
    let b = Budget::new(1 << 30, Duration::from_secs(60));
    let t = std::time::Instant::now();
    let e = b.try_reserve(12_582_912_000, "GetClips").await.unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(
        e.to_string(),
        "GetClips needs 12582912000 bytes (11.7 GiB), more than the whole budget, 0 of 1073741824 in use (max-inflight-bytes)"
    );
    assert_eq!(e.code(), crate::error::Code::ResourceExhausted);
    // Sums that overflow are refused too, never wrapped.
    let _r = b.try_reserve_now(1, "x").unwrap();
    assert!(b.try_reserve_now(u64::MAX, "y").is_err());
    assert_eq!(b.in_use(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reservation_gets_bytes_released_within_its_wait() {
    let b = Budget::new(100, Duration::from_secs(10));
    let held = b.try_reserve(80, "first").await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.try_reserve(50, "second").await.map(|r| r.bytes()) })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !waiter.is_finished(),
        "50 more bytes do not fit while 80 are held"
    );
    drop(held);
    assert_eq!(waiter.await.unwrap().unwrap(), 50);
    assert_eq!(b.in_use(), 0);

    // Nothing released within the wait: refused after it, not before.
    let b = Budget::new(100, Duration::from_millis(200));
    let _held = b.try_reserve(80, "first").await.unwrap();
    let t = std::time::Instant::now();
    assert!(b.try_reserve(50, "second").await.is_err());
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(190) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[tokio::test]
async fn absorbed_and_client_charged_reservations_keep_the_count() {
    let b = Budget::new(100, Duration::ZERO);
    let mut window = b
        .try_reserve(30, Who::new("stream").client(&Peer::unix(None, 1000)))
        .await
        .unwrap();
    assert_eq!(
        window.who().client.as_ref().map(|p| &p.key),
        Some(&PeerKey::User(1000))
    );
    let me = Peer::unix(None, 1000);
    let extra = b
        .try_reserve_now(20, Who::new("stream growth").client(&me))
        .unwrap();
    window.absorb(extra);
    assert_eq!((window.bytes(), b.in_use()), (50, 50));
    let other = Budget::new(10, Duration::ZERO);
    let foreign = other.try_reserve_now(5, "x").unwrap();
    window.absorb(foreign);
    assert_eq!((window.bytes(), b.in_use(), other.in_use()), (50, 50, 0));
    assert_eq!(b.client_in_use(&PeerKey::User(1000)), 50);
    drop(window);
    assert_eq!(b.in_use(), 0);
    assert_eq!(b.client_in_use(&PeerKey::User(1000)), 0);
    assert!(b.inner.used.lock().clients.is_empty());
}

/// 800 bytes, 200 of them kept in reserve, no per-client quota below the whole.
fn reserving(wait: Duration) -> Budget {
    Budget::shared(
        Shares {
            capacity: 800,
            per_client: 800,
            reserved: 200,
        },
        wait,
    )
}

fn client(pid: i32) -> Peer {
    Peer {
        key: PeerKey::Process { pid, start: 1 },
        uid: Some(1000),
        tcp_uid: None,
    }
}

#[test]
fn shares_refuse_past_the_quota_the_capacity_and_into_the_reserve() {
    let s = Shares {
        capacity: 8,
        per_client: 8,
        reserved: 2,
    };
    // Alone, a client takes the open part and no more: 6 of 8.
    assert_eq!(s.check(5, 5, 0, 1), Ok(()));
    assert_eq!(
        s.check(6, 6, 0, 1),
        Err(Over::Reserve {
            fair: 6,
            holders: 1
        })
    );
    // A client holding none gets a place of the reserve beside it, and a second: its fair share
    // with two holders is 3.
    assert_eq!(s.check(6, 0, 1, 1), Ok(()));
    assert_eq!(s.check(7, 1, 1, 1), Ok(()));
    assert_eq!(s.check(8, 2, 1, 1), Err(Over::Global));
    // Three places asked at once beside the heavy one: 3 is its share, so they fit...
    assert_eq!(s.check(5, 0, 1, 3), Ok(()));
    // ... and 4 do not.
    assert_eq!(
        s.check(4, 0, 1, 4),
        Err(Over::Reserve {
            fair: 3,
            holders: 2
        })
    );
    // The quota; sums that overflow are refused, never wrapped.
    let q = Shares { per_client: 4, ..s };
    assert_eq!(q.check(0, 4, 0, 1), Err(Over::Client));
    assert_eq!(q.check(0, 1, 0, u64::MAX), Err(Over::Global));
    assert_eq!(
        Shares::whole(10).check(u64::MAX, 0, 0, 1),
        Err(Over::Global)
    );
    // Many holders: the fair share never drops below one place.
    assert_eq!(s.check(6, 0, 100, 1), Ok(()));
}

#[tokio::test]
async fn a_client_is_held_to_its_quota_while_another_is_served() {
    let b = Budget::shared(
        Shares {
            capacity: 1000,
            per_client: 400,
            reserved: 0,
        },
        Duration::from_millis(20),
    );
    let (a, other) = (client(10), client(11));
    let _a1 = b
        .try_reserve(300, Who::new("GetClips").client(&a))
        .await
        .unwrap();
    let e = b
        .try_reserve(200, Who::new("GetClips").client(&a))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "GetClips for pid 10 (uid 1000) needs 200 bytes (200 B), 300 of 400 in use by this client (client-inflight-bytes)"
    );
    assert_eq!(e.code(), crate::error::Code::ResourceExhausted);
    // More than the quota at all: refused without waiting, saying so.
    let e = b
        .try_reserve_now(401, Who::new("x").client(&other))
        .unwrap_err();
    assert!(
        e.to_string().contains("more than a client's whole quota"),
        "{e}"
    );
    // The other client is not charged for the first one's bytes.
    let o = b
        .try_reserve(400, Who::new("GetClips").client(&other))
        .await
        .unwrap();
    assert_eq!(b.in_use(), 700);
    assert_eq!(b.client_in_use(&a.key), 300);
    drop(o);
    // In-process calls count only against the whole budget.
    let _local = b
        .try_reserve_now(700, Who::new("x").client(&Peer::local()))
        .unwrap();
    assert_eq!(b.in_use(), 1000);
    assert_eq!(b.refusals(), 2);
}

#[tokio::test]
async fn a_client_ask_past_the_open_part_is_refused_at_once() {
    // 700 of 800 with 200 kept in reserve: no release could ever let a client hold 700 (its fair
    // share of the open 600 is at most 600), so it does not wait out the 10 s.
    let b = reserving(Duration::from_secs(10));
    let started = std::time::Instant::now();
    let e = b
        .try_reserve(700, Who::new("GetClips").client(&client(22)))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        e.to_string(),
        "GetClips for pid 22 (uid 1000) needs 700 bytes (700 B), more than a client can ever hold: 200 of \
         the 800 are kept for clients below their fair share of the other 600 (reserved-inflight-bytes)"
    );
    // Exactly the open part: admitted; in-process calls are not held to it.
    let open = b
        .try_reserve(600, Who::new("GetClips").client(&client(22)))
        .await
        .unwrap();
    drop(open);
    b.try_reserve(700, Who::new("x").client(&Peer::local()))
        .await
        .unwrap();
}

#[tokio::test]
async fn the_reserve_is_left_for_a_light_client() {
    let b = reserving(Duration::ZERO);
    let (heavy, light) = (client(20), client(21));
    let _h = b
        .try_reserve(600, Who::new("stream").client(&heavy))
        .await
        .unwrap();
    let e = b
        .try_reserve(100, Who::new("stream").client(&heavy))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream for pid 20 (uid 1000) needs 100 bytes (100 B), 600 of 800 in use; the last 200 are kept \
         for clients below their fair share (600 bytes with 1 clients holding memory) and this one holds 600 \
         (reserved-inflight-bytes)"
    );
    let l = b
        .try_reserve(200, Who::new("GetClips").client(&light))
        .await
        .unwrap();
    assert_eq!((l.bytes(), b.in_use()), (200, 800));
}

#[test]
fn human_sizes() {
    assert_eq!(human_bytes(750), "750 B");
    assert_eq!(human_bytes(1536), "1.5 KiB");
    assert_eq!(human_bytes(13_194_139_533_312), "12.0 TiB");
}
