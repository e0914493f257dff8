//! Index-build places, shared fairly between clients.
//!
//! An index build holds a core for as long as the file takes to scan (seconds for a long video, minutes
//! for one indexed by decoding), and builds are bounded to the decode thread count. A FIFO queue let
//! one client that asked for many unindexed videos at once make every other client wait behind all of
//! them: 13 unindexed 900k-frame videos from one client kept another client's first request waiting
//! 21 s (probe P, F4). Here every client ([`PeerKey`]) waiting for a place has its own FIFO, and a freed
//! place goes to the next waiting client in round-robin order, so a client that joins the queue waits
//! for at most one build per other waiting client before its own starts, however many they queued.
//!
//! Input: a client asking for a place. Output: a [`Place`], held until the build ends (dropping it
//! hands it to the next client's first waiter). Invariants: places out ≤ capacity; a place freed while
//! anyone waits goes straight to a waiter (never back to the pool), so a newcomer cannot overtake the
//! queue; a waiter that gives up (its request went away) leaves the queue at once, and a place sent to
//! it as it went is passed on. A client is a process (its [`PeerKey`]): a job of several processes has a
//! turn for each.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::peer::PeerKey;

/// Places for index builds, handed out fairly between clients.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    /// Clients with waiters, in the order their turns come; each with its waiters (by number), oldest
    /// first.
    queue: VecDeque<(PeerKey, VecDeque<Waiter>)>,
    next: u64,
}

/// A waiter in the queue: its number and where its place goes.
type Waiter = (u64, oneshot::Sender<Place>);

/// A waiter's entry in the queue, taken out if the waiter gives up before its turn.
struct Waiting<'a> {
    gate: &'a Gate,
    who: &'a PeerKey,
    number: u64,
    done: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = self.gate.state.lock();
        if let Some(at) = s.queue.iter().position(|(k, _)| k == self.who) {
            let waiters = &mut s.queue[at].1;
            waiters.retain(|(n, _)| *n != self.number);
            if waiters.is_empty() {
                s.queue.remove(at);
            }
        }
    }
}

/// One place, held for the length of a build; dropping it passes it on.
#[derive(Debug)]
pub struct Place {
    gate: Option<Arc<Gate>>,
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(g) = self.gate.take() {
            g.release();
        }
    }
}

impl Gate {
    pub fn new(places: usize) -> Arc<Gate> {
        Arc::new(Gate {
            state: Mutex::new(State {
                free: places.max(1),
                queue: VecDeque::new(),
                next: 0,
            }),
        })
    }

    /// A place for `who`: at once when one is free, else when its turn comes. None only if the gate
    /// was dropped while waiting.
    pub async fn acquire(self: &Arc<Self>, who: &PeerKey) -> Option<Place> {
        let (number, rx) = {
            let mut s = self.state.lock();
            if s.free > 0 {
                s.free -= 1;
                return Some(Place {
                    gate: Some(self.clone()),
                });
            }
            let (tx, rx) = oneshot::channel();
            let number = s.next;
            s.next += 1;
            match s.queue.iter_mut().find(|(k, _)| k == who) {
                Some((_, waiters)) => waiters.push_back((number, tx)),
                None => s
                    .queue
                    .push_back((who.clone(), VecDeque::from([(number, tx)]))),
            }
            (number, rx)
        };
        // Dropped before its turn, `waiting` takes the entry out (before `rx` goes, so a place sent
        // meanwhile is dropped with `rx` and passed on, outside the lock).
        let mut waiting = Waiting {
            gate: self,
            who,
            number,
            done: false,
        };
        let place = rx.await.ok();
        waiting.done = true;
        place
    }

    /// Waiters, and places free.
    pub fn waiting(&self) -> (usize, usize) {
        let s = self.state.lock();
        (s.queue.iter().map(|(_, w)| w.len()).sum(), s.free)
    }

    /// Hands a freed place to the next client's oldest live waiter, or back to the pool.
    fn release(self: Arc<Self>) {
        let mut s = self.state.lock();
        let mut place = Place {
            gate: Some(self.clone()),
        };
        while let Some((who, mut waiters)) = s.queue.pop_front() {
            let next = waiters.pop_front();
            if !waiters.is_empty() {
                // Its next waiter's turn comes after every other waiting client's.
                s.queue.push_back((who, waiters));
            }
            let Some((_, tx)) = next else { continue };
            match tx.send(place) {
                Ok(()) => return,
                // It gave up: the place goes to the next one (given back here, not dropped, which
                // would release again under the lock).
                Err(p) => place = p,
            }
        }
        place.gate = None;
        s.free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn client(pid: i32) -> PeerKey {
        PeerKey::Process { pid, start: 1 }
    }

    /// Places freed while clients wait go round the clients, each client's own waiters in order; a
    /// client that queued many does not make a later one wait behind them all.
    #[tokio::test]
    async fn places_go_round_the_waiting_clients() {
        let gate = Gate::new(1);
        let held = gate.acquire(&client(1)).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        // Client 1 queues five builds, then client 2 two and client 3 one.
        for (c, n) in [(1, 5), (2, 2), (3, 1)] {
            for i in 0..n {
                let (g, tx) = (gate.clone(), tx.clone());
                tasks.push(tokio::spawn(async move {
                    let place = g.acquire(&client(c)).await.unwrap();
                    tx.send((c, i)).unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    drop(place);
                }));
                // Queued in this order.
                while gate.waiting().0 < tasks.len() {
                    tokio::task::yield_now().await;
                }
            }
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        drop(tx);
        let mut order = Vec::new();
        while let Some(x) = rx.recv().await {
            order.push(x);
        }
        assert_eq!(
            order,
            [
                (1, 0),
                (2, 0),
                (3, 0),
                (1, 1),
                (2, 1),
                (1, 2),
                (1, 3),
                (1, 4)
            ]
        );
        assert_eq!(gate.waiting(), (0, 1));
    }

    /// A waiter that gives up leaves the queue: the place goes to the next, and no place is lost.
    #[tokio::test]
    async fn a_waiter_that_gives_up_is_skipped_and_no_place_is_lost() {
        let gate = Gate::new(2);
        let a = gate.acquire(&client(1)).await.unwrap();
        let b = gate.acquire(&client(1)).await.unwrap();
        let gone = tokio::spawn({
            let g = gate.clone();
            async move { g.acquire(&client(2)).await }
        });
        let next = tokio::spawn({
            let g = gate.clone();
            async move { g.acquire(&client(3)).await.map(|_| ()) }
        });
        while gate.waiting().0 < 2 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        // Its entry left the queue with it: only the third client waits.
        assert_eq!(gate.waiting(), (1, 0));
        drop(a);
        next.await.unwrap().unwrap();
        // The place the third client took and dropped is free again, beside the one b holds.
        assert_eq!(gate.waiting(), (0, 1));
        drop(b);
        assert_eq!(gate.waiting(), (0, 2));
        // A place sent to a waiter that is dropped before it looks is passed on, not lost.
        let c = gate.acquire(&client(1)).await.unwrap();
        let d = gate.acquire(&client(1)).await.unwrap();
        let late = {
            let g = gate.clone();
            Box::pin(async move { g.acquire(&client(4)).await })
        };
        let mut late = late;
        assert!(futures::poll!(&mut late).is_pending());
        drop(c);
        drop(late);
        drop(d);
        assert_eq!(gate.waiting(), (0, 2));
    }
}
