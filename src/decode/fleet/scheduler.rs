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

/// No job came in the time a thread waited for one.
#[derive(Debug, PartialEq)]
pub(super) struct Idle;

/// A client whose turn [`Queues::pop`] passes over, and what another client's next job must be to be
/// taken.
type Except<'a, T> = (u64, &'a dyn Fn(&T) -> bool);

/// The queue: clients' rings of tenants' FIFOs of (long, job).
pub(super) struct Queues<T> {
    clients: Ring<u64, Ring<u64, VecDeque<(bool, T)>>>,
    len: usize,
    closed: bool,
    /// Long runs ([`super::Job::long`]) one client may run at once.
    long_cap: usize,
    /// Long runs each client runs now.
    running_long: HashMap<u64, usize>,
}

impl<T> Queues<T> {
    /// The next job in turn. With `cap`, a client running `long_cap` long runs gives its turn to its next
    /// tenant whose next job is short, or, with none, to the next client (its long jobs wait).
    /// `count`: the job will run, and a long one counts until [`Scheduler::long_done`]. `except`: a
    /// client whose turn is passed over, and what the next job of another must be to be taken (the
    /// clients passed over keep their jobs where they are).
    fn pop(&mut self, cap: bool, count: bool, except: Option<Except<'_, T>>) -> Option<T> {
        for _ in 0..self.clients.turns.len() {
            let &client = self.clients.turns.front()?;
            if let Some((c, fits)) = except {
                let next = self.clients.members.get(&client).and_then(|tenants| {
                    let tenant = tenants.turns.front()?;
                    tenants.members.get(tenant)?.front()
                });
                if c == client || !next.is_some_and(|(_, job)| fits(job)) {
                    self.clients.turns.rotate_left(1);
                    continue;
                }
            }
            let full = cap && self.running_long.get(&client).copied().unwrap_or(0) >= self.long_cap;
            if full {
                let tenants = self.clients.members.get_mut(&client)?;
                let short = tenants.turns.iter().position(|t| {
                    tenants
                        .members
                        .get(t)
                        .and_then(|f| f.front())
                        .is_some_and(|(long, _)| !long)
                });
                match short {
                    Some(i) => tenants.turns.rotate_left(i),
                    None => {
                        self.clients.turns.rotate_left(1);
                        continue;
                    }
                }
            }
            let (long, job) = self.clients.next(|tenants| {
                let job = tenants.next(|fifo| {
                    let job = fifo.pop_front();
                    (job, !fifo.is_empty())
                });
                (job, !tenants.turns.is_empty())
            })?;
            if long && count {
                *self.running_long.entry(client).or_default() += 1;
            }
            self.len -= 1;
            return Some(job);
        }
        None
    }
}

pub(super) struct Scheduler<T> {
    queues: Mutex<Queues<T>>,
    ready: Condvar,
}

impl<T> Scheduler<T> {
    /// A queue whose clients each run at most `long_cap` long jobs at once.
    pub(super) fn new(long_cap: usize) -> Self {
        Scheduler {
            queues: Mutex::new(Queues {
                clients: Ring::new(),
                len: 0,
                closed: false,
                long_cap: long_cap.max(1),
                running_long: HashMap::new(),
            }),
            ready: Condvar::new(),
        }
    }

    pub(super) fn push(
        &self,
        client: u64,
        tenant: u64,
        long: bool,
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
            .push_back((long, job));
        q.len += 1;
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// The next job in turn that may run now (a client's long jobs wait while it runs its cap of
    /// them); waits for one. A long job taken counts against its client until [`Scheduler::long_done`].
    /// None once closed and empty.
    #[cfg(test)]
    pub(super) fn pop(&self) -> Option<T> {
        self.pop_until(None).unwrap_or(None)
    }

    /// [`Scheduler::pop`], waiting at most `wait`: Err(Idle) when no job came in that time.
    pub(super) fn pop_within(&self, wait: std::time::Duration) -> Result<Option<T>, Idle> {
        self.pop_until(Some(std::time::Instant::now() + wait))
    }

    fn pop_until(&self, deadline: Option<std::time::Instant>) -> Result<Option<T>, Idle> {
        let mut q = self.queues.lock();
        loop {
            // Closed: the queue drains without the cap (shutdown waits for the threads to take it).
            let cap = !q.closed;
            if let Some(job) = q.pop(cap, true, None) {
                return Ok(Some(job));
            }
            if q.closed && q.len == 0 {
                return Ok(None);
            }
            match deadline {
                None => self.ready.wait(&mut q),
                Some(d) if std::time::Instant::now() >= d => return Err(Idle),
                Some(d) => {
                    self.ready.wait_until(&mut q, d);
                }
            }
        }
    }

    /// The next job in turn, long or not, without waiting (to fail it: it does not run).
    pub(super) fn try_pop(&self) -> Option<T> {
        self.queues.lock().pop(false, false, None)
    }

    /// The next job in turn of a client other than `client` for which `fits` holds, without waiting: what
    /// a run of `client` pauses for ([`super::worker`]). Counted as [`Scheduler::pop`]'s.
    pub(super) fn pop_other(&self, client: u64, fits: &dyn Fn(&T) -> bool) -> Option<T> {
        let mut q = self.queues.lock();
        let cap = !q.closed;
        q.pop(cap, true, Some((client, fits)))
    }

    /// A long job `client` took has ended: its next long job may run.
    pub(super) fn long_done(&self, client: u64) {
        let mut q = self.queues.lock();
        if let Some(n) = q.running_long.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                q.running_long.remove(&client);
            }
        }
        drop(q);
        self.ready.notify_all();
    }

    #[cfg(test)]
    fn try_pop_capped(&self) -> Option<T> {
        self.queues.lock().pop(true, true, None)
    }

    pub(super) fn close(&self) {
        self.queues.lock().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run pauses only for another client's job that fits: its own client's jobs, and jobs that do not
    /// fit, stay queued in their order.
    #[test]
    fn a_paused_run_takes_the_next_fitting_job_of_another_client() {
        let s = Scheduler::new(1);
        s.push(1, 10, false, (1, 5), None).unwrap();
        s.push(2, 20, false, (2, 900), None).unwrap();
        s.push(2, 20, false, (2, 7), None).unwrap();
        s.push(3, 30, false, (3, 8), None).unwrap();
        let small = |job: &(u64, i32)| job.1 < 100;
        // Client 1's job is its own; client 2's next job does not fit: client 3's is taken.
        assert_eq!(s.pop_other(1, &small), Some((3, 8)));
        assert_eq!(
            s.pop_other(1, &small),
            None,
            "client 2's next job is still the big one"
        );
        assert_eq!(s.pop_other(2, &|_| true), Some((1, 5)));
        let rest: Vec<(u64, i32)> = std::iter::from_fn(|| s.try_pop()).collect();
        assert_eq!(rest, vec![(2, 900), (2, 7)]);
    }

    #[test]
    fn tenants_take_turns_and_the_bound_applies_to_bounded_pushes() {
        let s = Scheduler::new(1);
        // Tenant 1 queues six jobs before tenant 2 queues two and tenant 3 one.
        for i in 0..6 {
            s.push(1, 1, false, (1, i), None).unwrap();
        }
        s.push(2, 2, false, (2, 0), None).unwrap();
        s.push(2, 2, false, (2, 1), None).unwrap();
        s.push(3, 3, false, (3, 0), Some(100)).unwrap();
        assert!(matches!(
            s.push(4, 4, false, (4, 0), Some(9)),
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
            s.push(1, 1, false, (1, 9), None),
            Err(DecodeError::ShuttingDown)
        ));
    }

    /// A wait with a bound ends Idle when nothing came, takes a job pushed while it waits, and ends
    /// None once closed.
    #[test]
    fn a_bounded_wait_ends_idle_or_with_a_job() {
        let s = std::sync::Arc::new(Scheduler::new(1));
        let wait = std::time::Duration::from_millis(50);
        let start = std::time::Instant::now();
        assert_eq!(s.pop_within(wait), Err(Idle));
        assert!(start.elapsed() >= wait);
        let pusher = {
            let s = s.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                s.push(1, 1, false, "job", None).unwrap();
            })
        };
        assert_eq!(
            s.pop_within(std::time::Duration::from_secs(10)),
            Ok(Some("job"))
        );
        pusher.join().unwrap();
        s.close();
        assert_eq!(s.pop_within(wait), Ok(None));
    }

    /// A client with many calls open gets one turn per round like a client with one: its calls share
    /// its turns among themselves.
    #[test]
    fn clients_take_turns_and_their_calls_share_their_turns() {
        let s = Scheduler::new(1);
        // Client 1 has 3 calls (tenants 10, 11, 12) with 3 jobs each; client 2 one call with 3 jobs.
        for t in 10..13u64 {
            for i in 0..3 {
                s.push(1, t, false, (t, i), None).unwrap();
            }
        }
        for i in 0..3 {
            s.push(2, 20, false, (20, i), None).unwrap();
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

    /// A client runs at most `long_cap` long jobs at once: its next long job waits (its short jobs and
    /// other clients' jobs go first) until one ends.
    #[test]
    fn a_client_runs_at_most_its_cap_of_long_jobs() {
        let s = Scheduler::new(1);
        s.push(1, 10, true, "a-long-1", None).unwrap();
        s.push(1, 10, true, "a-long-2", None).unwrap();
        s.push(1, 11, false, "a-short", None).unwrap();
        s.push(2, 20, false, "b-short", None).unwrap();
        assert_eq!(s.try_pop_capped(), Some("a-long-1"));
        // Client 1 runs its one long job: its short job goes in its turn, its second long job waits.
        assert_eq!(s.try_pop_capped(), Some("b-short"));
        assert_eq!(s.try_pop_capped(), Some("a-short"));
        assert_eq!(s.try_pop_capped(), None, "a-long-2 waits");
        s.long_done(1);
        assert_eq!(s.try_pop_capped(), Some("a-long-2"));
        // Another client's long job is not held back by client 1's.
        s.push(2, 20, true, "b-long", None).unwrap();
        assert_eq!(s.try_pop_capped(), Some("b-long"));
        // Failing the queue takes long jobs regardless.
        s.push(1, 10, true, "a-long-3", None).unwrap();
        assert_eq!(s.try_pop_capped(), None);
        assert_eq!(s.try_pop(), Some("a-long-3"));
    }
}
