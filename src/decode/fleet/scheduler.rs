//! The fleet's queue: one FIFO per tenant and a round-robin ring of the tenants that have jobs, so N
//! tenants with work queued get about 1/N of the threads each, however much each has queued. Input:
//! jobs pushed under a tenant (bounded pushes are refused past the capacity). Output: jobs in
//! round-robin order; `None` once closed and empty.

use std::collections::{HashMap, VecDeque};

use parking_lot::{Condvar, Mutex};

use crate::decode::DecodeError;

/// The queue: one FIFO per tenant and the round-robin ring of tenants that have jobs.
pub(super) struct Queues<T> {
    per_tenant: HashMap<u64, VecDeque<T>>,
    ring: VecDeque<u64>,
    len: usize,
    closed: bool,
}

pub(super) struct Scheduler<T> {
    queues: Mutex<Queues<T>>,
    ready: Condvar,
}

impl<T> Scheduler<T> {
    pub(super) fn new() -> Self {
        Scheduler {
            queues: Mutex::new(Queues {
                per_tenant: HashMap::new(),
                ring: VecDeque::new(),
                len: 0,
                closed: false,
            }),
            ready: Condvar::new(),
        }
    }

    pub(super) fn push(
        &self,
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
        let fifo = q.per_tenant.entry(tenant).or_default();
        fifo.push_back(job);
        if fifo.len() == 1 {
            q.ring.push_back(tenant);
        }
        q.len += 1;
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// The next job in round-robin order; None once closed and empty.
    pub(super) fn pop(&self) -> Option<T> {
        let mut q = self.queues.lock();
        loop {
            if let Some(tenant) = q.ring.pop_front() {
                let Some(fifo) = q.per_tenant.get_mut(&tenant) else {
                    continue;
                };
                let job = fifo.pop_front();
                if fifo.is_empty() {
                    q.per_tenant.remove(&tenant);
                } else {
                    q.ring.push_back(tenant);
                }
                if job.is_some() {
                    q.len -= 1;
                    return job;
                }
                continue;
            }
            if q.closed {
                return None;
            }
            self.ready.wait(&mut q);
        }
    }

    /// The next job in round-robin order, without waiting.
    pub(super) fn try_pop(&self) -> Option<T> {
        let mut q = self.queues.lock();
        while let Some(tenant) = q.ring.pop_front() {
            let Some(fifo) = q.per_tenant.get_mut(&tenant) else {
                continue;
            };
            let job = fifo.pop_front();
            if fifo.is_empty() {
                q.per_tenant.remove(&tenant);
            } else {
                q.ring.push_back(tenant);
            }
            if job.is_some() {
                q.len -= 1;
                return job;
            }
        }
        None
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
            s.push(1, (1, i), None).unwrap();
        }
        s.push(2, (2, 0), None).unwrap();
        s.push(2, (2, 1), None).unwrap();
        s.push(3, (3, 0), Some(100)).unwrap();
        assert!(matches!(
            s.push(4, (4, 0), Some(9)),
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
            s.push(1, (1, 9), None),
            Err(DecodeError::ShuttingDown)
        ));
    }
}
