//! Tests of the connection gate and its watchdog (`conns.rs`).

use super::*;

/// A reply's pieces as a test sets them: (held, bytes, written).
#[derive(Default)]
struct Pieces(parking_lot::Mutex<(usize, u64, u64)>);

impl crate::peer::Reply for Pieces {
    fn pieces(&self) -> (usize, u64, u64) {
        *self.0.lock()
    }
}

fn follow(link: &Link) -> Arc<Pieces> {
    let reply = Arc::new(Pieces::default());
    link.follow(Arc::downgrade(&reply) as std::sync::Weak<dyn crate::peer::Reply>);
    reply
}

/// The watchdog closes a connection only when one reply's pieces were held and none written for the
/// whole idle time: a slow but steady reader keeps it, pieces held for less than the idle time keep
/// it, a sibling reply's progress does not keep it, and it ends with the connection.
#[tokio::test(start_paused = true)]
async fn the_watchdog_closes_only_a_connection_whose_pieces_wait_the_idle_time() {
    let idle = Duration::from_secs(8);
    let start = tokio::time::Instant::now();
    let link = Link::new();
    let dog = tokio::spawn(watch(
        link.clone(),
        Some(idle),
        None,
        Holder::Process(1, 1000),
    ));
    // A reader writing one piece every 7 s of 8: never closed.
    let steady = follow(&link);
    for written in 1..=6 {
        *steady.0.lock() = (2, 20, written - 1);
        tokio::time::sleep(Duration::from_secs(7)).await;
        *steady.0.lock() = (1, 10, written);
        assert!(!link.is_closed(), "a steady reader was cut off");
    }
    // Nothing held for long: never closed.
    *steady.0.lock() = (0, 0, 7);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!link.is_closed());
    // One reply held with nothing written while its sibling writes a piece every second: closed
    // after 8 to 10 s.
    let stuck = follow(&link);
    *stuck.0.lock() = (1, 10, 0);
    let stall = tokio::time::Instant::now();
    let mut written = 7;
    while !link.is_closed() {
        written += 1;
        *steady.0.lock() = (1, 10, written);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let waited = stall.elapsed();
    assert!(
        waited >= idle && waited <= idle + idle / 4 + Duration::from_secs(1),
        "closed after {waited:?}"
    );
    dog.await.unwrap();
    assert!(start.elapsed() > Duration::from_secs(80));

    // A connection that goes ends its watchdog.
    let link = Link::new();
    let dog = tokio::spawn(watch(link.clone(), Some(idle), None, Holder::Unknown));
    *follow(&link).0.lock() = (1, 1, 0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    link.end();
    tokio::time::timeout(Duration::from_secs(1), dog)
        .await
        .expect("the watchdog ends with its connection")
        .unwrap();
    assert!(!link.is_closed());
}

/// A TCP connection that begins no call within the first-call time is closed; one with a call open
/// is kept however long the call takes; one whose calls ended is closed after the quiet time.
#[tokio::test(start_paused = true)]
async fn a_connection_without_calls_is_closed_after_its_quiet_time() {
    let quiet = Quiet {
        first_call: Duration::from_secs(10),
        between_calls: Duration::from_secs(60),
    };
    let closed_after = |link: Arc<Link>| async move {
        let t0 = tokio::time::Instant::now();
        while !link.is_closed() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        t0.elapsed()
    };
    // Never a call: closed after 10 s (to 10 s + a tick).
    let link = Link::new();
    let dog = tokio::spawn(watch(link.clone(), None, Some(quiet), Holder::Unknown));
    let waited = closed_after(link).await;
    assert!(
        waited >= Duration::from_secs(10) && waited <= Duration::from_secs(12),
        "{waited:?}"
    );
    dog.await.unwrap();

    // A call open for 5 minutes keeps it; 60 s after the call ends it is closed.
    let link = Link::new();
    let dog = tokio::spawn(watch(
        link.clone(),
        Some(Duration::from_secs(8)),
        Some(quiet),
        Holder::Unknown,
    ));
    link.call_began();
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(!link.is_closed(), "closed with a call open");
    link.call_ended();
    let waited = closed_after(link).await;
    assert!(
        waited >= Duration::from_secs(59) && waited <= Duration::from_secs(62),
        "{waited:?}"
    );
    dog.await.unwrap();
}

/// TCP clients, from any number of addresses, take at most three quarters of the total; the rest
/// is kept for Unix-socket clients.
#[test]
fn tcp_clients_leave_a_quarter_of_the_places_to_unix_clients() {
    let gate = Gate::with_total(40);
    let held: Vec<Ticket> = (0..30)
        .map(|i| {
            gate.admit(Holder::Address(format!("10.0.0.{i}").parse().unwrap()))
                .expect("below three quarters")
        })
        .collect();
    assert!(gate
        .admit(Holder::Address("10.0.1.1".parse().unwrap()))
        .is_none());
    let unix: Vec<Ticket> = (0..10)
        .map(|i| {
            gate.admit(Holder::Process(100 + i, 1000))
                .expect("kept for Unix")
        })
        .collect();
    assert!(
        gate.admit(Holder::Process(200, 1000)).is_none(),
        "the total"
    );
    drop((held, unix));
    assert_eq!(gate.open(), 0);
}

/// The processes of one user together take at most a quarter of the places: one user's children
/// passing their connections on (`SCM_RIGHTS`) cannot take every place from the other users.
#[test]
fn one_users_processes_take_at_most_a_quarter_of_the_places() {
    let gate = Gate::with_total(16 * PER_PROCESS + 8);
    let quarter = gate.total_limit / USER_SHARE_DIVISOR;
    assert!(
        quarter > 4 * PER_PROCESS,
        "the share, not the floor, binds here"
    );
    let held: Vec<Ticket> = (0..quarter)
        .map(|i| {
            gate.admit(Holder::Process(i as i32 % 7 + 1, 1000))
                .expect("below the user's share")
        })
        .collect();
    assert!(
        gate.admit(Holder::Process(99, 1000)).is_none(),
        "a new process of the same user"
    );
    let other = gate
        .admit(Holder::Process(100, 1001))
        .expect("another user");
    drop(held.into_iter().next());
    assert!(
        gate.admit(Holder::Process(99, 1000)).is_some(),
        "a place of the user freed"
    );
    drop(other);
}

#[test]
fn a_client_over_its_bound_is_refused_and_a_closed_connection_frees_its_place() {
    let gate = Gate::with_total(PER_PROCESS + 2);
    let _c = gate
        .admit(Holder::Address("10.0.0.1".parse().unwrap()))
        .unwrap();
    let a = Holder::Process(7, 1000);
    let held: Vec<Ticket> = (0..PER_PROCESS)
        .map(|_| gate.admit(a.clone()).unwrap())
        .collect();
    assert!(
        gate.admit(a.clone()).is_none(),
        "over the per-process bound"
    );
    let b = gate
        .admit(Holder::Process(8, 1001))
        .expect("another process");
    assert_eq!(gate.open(), PER_PROCESS + 2);
    assert!(
        gate.admit(Holder::Process(9, 1002)).is_none(),
        "over the total"
    );
    drop(b);
    assert!(
        gate.admit(Holder::Process(9, 1002)).is_some(),
        "a place freed"
    );
    drop(held);
    assert!(gate.admit(a).is_some());
}
