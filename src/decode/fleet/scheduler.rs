//! The fleet's queue: two rounds of turns. Clients (processes; addresses on TCP) with jobs queued take
//! turns, and within a client its tenants (one stream, or one GetClips call) take turns, each with its
//! own FIFO. So N clients with work queued get about 1/N of the threads each, however many calls or
//! streams each has open and however much each has queued (per call alone, a process with 24 calls
//! open got 24 turns to another client's one). Input: jobs pushed under a client and a tenant
//! (bounded pushes are refused past the capacity). Output: jobs in that order; `None` once closed and
//! empty.

use std::collections::{HashMap, VecDeque};

use parking_lot::{Condvar, Mutex};

use crate::decode::DecodeError;

/// One round of turns: a FIFO per member and the ring of members that have items.
struct Ring<K, V> {
    members: HashMap<K, V>,
    turns: VecDeque<K>,
}

impl<K: std::hash::Hash + Eq + Copy, V> Ring<K, V> {
    fn new() -> Self {
        Ring {
            members: HashMap::new(),
            turns: VecDeque::new(),
        }
    }

    /// The member `k`, added (and given a turn at the back) when new.
    fn member(&mut self, k: K, new: impl FnOnce() -> V) -> &mut V {
        match self.members.entry(k) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.turns.push_back(k);
                e.insert(new())
            }
        }
    }

    /// Takes one item from the member whose turn it is (`take` returns the item and whether the member
    /// has more); the member goes to the back of the ring, or leaves it when it has no more.
    fn next<T>(&mut self, take: impl FnOnce(&mut V) -> (Option<T>, bool)) -> Option<T> {
        let k = self.turns.pop_front()?;
        let v = self.members.get_mut(&k)?;
        let (item, more) = take(v);
        if more {
            self.turns.push_back(k);
        } else {
            self.members.remove(&k);
        }
        item
    }
}

/// The queue: clients' rings of tenants' FIFOs.
pub(super) struct Queues<T> {
    clients: Ring<u64, Ring<u64, VecDeque<T>>>,
    len: usize,
    closed: bool,
}

impl<T> Queues<T> {
    fn pop(&mut self) -> Option<T> {
        let job = self.clients.next(|tenants| {
            let job = tenants.next(|fifo| {
                let job = fifo.pop_front();
                (job, !fifo.is_empty())
            });
            (job, !tenants.turns.is_empty())
        })?;
        self.len -= 1;
        Some(job)
    }
}

pub(super) struct Scheduler<T> {
    queues: Mutex<Queues<T>>,
    ready: Condvar,
}

impl<T> Scheduler<T> {
    pub(super) fn new() -> Self {
        Scheduler {
            queues: Mutex::new(Queues {
                clients: Ring::new(),
                len: 0,
                closed: false,
            }),
            ready: Condvar::new(),
        }
    }

    pub(super) fn push(
        &self,
        client: u64,
        tenant: u64,
        job: T,
        capacity: Option<usize>,
    ) -> Result<(), DecodeError> {
        let mut q = self.queues.lock();
        if q.closed {
            return Err(DecodeError::ShuttingDown);
        }
        if let Some(cap) = capacity {
            if q.len >= cap {
                return Err(DecodeError::Overloaded(cap));
            }
        }
        q.clients
            .member(client, Ring::new)
            .member(tenant, VecDeque::new)
            .push_back(job);
        q.len += 1;
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// The next job in turn; None once closed and empty.
    pub(super) fn pop(&self) -> Option<T> {
        let mut q = self.queues.lock();
        loop {
            if let Some(job) = q.pop() {
                return Some(job);
            }
            if q.closed {
                return None;
            }
            self.ready.wait(&mut q);
        }
    }

    /// The next job in turn, without waiting.
    pub(super) fn try_pop(&self) -> Option<T> {
        self.queues.lock().pop()
    }

    pub(super) fn close(&self) {
        self.queues.lock().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_take_turns_and_the_bound_applies_to_bounded_pushes() {
        let s = Scheduler::new();
        // Tenant 1 queues six jobs before tenant 2 queues two and tenant 3 one.
        for i in 0..6 {
            s.push(1, 1, (1, i), None).unwrap();
        }
        s.push(2, 2, (2, 0), None).unwrap();
        s.push(2, 2, (2, 1), None).unwrap();
        s.push(3, 3, (3, 0), Some(100)).unwrap();
        assert!(matches!(
            s.push(4, 4, (4, 0), Some(9)),
            Err(DecodeError::Overloaded(9))
        ));
        let order: Vec<(u64, i32)> = std::iter::from_fn(|| {
            let q = s.queues.lock();
            if q.len == 0 {
                return None;
            }
            drop(q);
            s.pop()
        })
        .collect();
        assert_eq!(
            order,
            vec![
                (1, 0),
                (2, 0),
                (3, 0),
                (1, 1),
                (2, 1),
                (1, 2),
                (1, 3),
                (1, 4),
                (1, 5)
            ]
        );
        s.close();
        assert!(s.pop().is_none());
        assert!(matches!(
            s.push(1, 1, (1, 9), None),
            Err(DecodeError::ShuttingDown)
        ));
    }

    /// A client with many calls open gets one turn per round like a client with one: its calls share
    /// its turns among themselves.
    #[test]
    fn clients_take_turns_and_their_calls_share_their_turns() {
        let s = Scheduler::new();
        // Client 1 has 3 calls (tenants 10, 11, 12) with 3 jobs each; client 2 one call with 3 jobs.
        for t in 10..13u64 {
            for i in 0..3 {
                s.push(1, t, (t, i), None).unwrap();
            }
        }
        for i in 0..3 {
            s.push(2, 20, (20, i), None).unwrap();
        }
        let order: Vec<(u64, i32)> = std::iter::from_fn(|| s.try_pop()).collect();
        assert_eq!(
            order,
            vec![
                (10, 0),
                (20, 0),
                (11, 0),
                (20, 1),
                (12, 0),
                (20, 2),
                (10, 1),
                (11, 1),
                (12, 1),
                (10, 2),
                (11, 2),
                (12, 2)
            ]
        );
        assert_eq!(s.queues.lock().len, 0);
    }
}
