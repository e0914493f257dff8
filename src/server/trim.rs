//! Handing freed memory back to the system once the daemon goes idle.
//!
//! glibc keeps what the daemon frees in its heaps: its mmap threshold rises as large blocks are freed,
//! so the buffers of a burst (8192x8192 decoders, replies of hundreds of MiB) come back to the heap and
//! stay resident. After two 8192x8192 videos with 16 references an idle daemon whose gauges all read 0
//! stayed at 2.1 GB (probe P, F2 and F7); operators reading RSS against the budgets saw it "over budget"
//! long after the load. `malloc_trim(0)` on that process handed back all but 45 MB.
//!
//! So once calls that do work (Probe, ListDatasets, Reload, GetClips, StreamBatches, CheckDataset; not
//! health checks, GetStats or slot releases, which pollers send all the time) have finished and none
//! has run during a whole [`TICK`] (checked at each tick: idle for 2 to 4 s), the daemon trims once, on a
//! blocking thread. A client sending requests back to back never leaves a whole tick idle, so busy
//! daemons do not trim (what is handed back is faulted in again at the next burst, which costs this kind
//! of machine about 0.7 ms per MiB: run s32); one that pauses longer between bursts may pay that once
//! a burst.

use std::time::{Duration, Instant};

use crate::metrics::CallActivity;

/// How long the daemon must have been idle before it trims.
pub const TICK: Duration = Duration::from_secs(2);

/// Trims after each burst of calls, as the module comment says; runs until aborted.
pub async fn run(calls: CallActivity) {
    after_bursts(calls, || {
        let (before, after, took) = trim();
        let handed = before.saturating_sub(after);
        if handed >= 64 << 20 {
            tracing::info!(
                rss_before_mib = before >> 20,
                rss_after_mib = after >> 20,
                ms = took.as_secs_f64() * 1e3,
                "idle: freed memory handed back to the system"
            );
        } else {
            tracing::debug!(
                rss_before_mib = before >> 20,
                rss_after_mib = after >> 20,
                ms = took.as_secs_f64() * 1e3,
                "idle: heap trimmed"
            );
        }
    })
    .await
}

/// Calls `work` on a blocking thread once after each burst: when calls have finished since the last time
/// and none ran or finished during a whole [`TICK`].
async fn after_bursts(calls: CallActivity, work: impl Fn() + Clone + Send + 'static) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = calls.finished();
    let mut done = seen;
    loop {
        interval.tick().await;
        let finished = calls.finished();
        let idle = finished == seen && calls.active() == 0;
        seen = finished;
        if idle && finished != done {
            done = finished;
            let _ = tokio::task::spawn_blocking(work.clone()).await;
        }
    }
}

/// Resident bytes before and after trimming the heap, and how long the trim took.
pub fn trim() -> (u64, u64, Duration) {
    let before = resident_bytes();
    let start = Instant::now();
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
    let took = start.elapsed();
    (before, resident_bytes(), took)
}

/// This process's resident bytes (`VmRSS`), 0 when unknown.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb << 10)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// One trim a burst, once the burst has been idle a whole tick; none while calls run, none when
    /// nothing ran.
    #[tokio::test(start_paused = true)]
    async fn the_heap_is_trimmed_once_after_each_burst() {
        let calls = CallActivity::default();
        let trims = Arc::new(AtomicUsize::new(0));
        let counted = trims.clone();
        let task = tokio::spawn(after_bursts(calls.clone(), move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        let wait = |ticks: u32| tokio::time::sleep(TICK * ticks + Duration::from_millis(10));
        wait(3).await;
        assert_eq!(trims.load(Ordering::SeqCst), 0, "nothing ran");
        // A long call: nothing while it runs, one trim a tick after it ends.
        calls.started();
        wait(3).await;
        assert_eq!(trims.load(Ordering::SeqCst), 0, "a call in flight");
        calls.ended();
        wait(3).await;
        assert_eq!(trims.load(Ordering::SeqCst), 1);
        // Steady short calls, one finishing every half tick: no trim until they stop.
        for _ in 0..8 {
            calls.started();
            calls.ended();
            tokio::time::sleep(TICK / 2).await;
        }
        assert_eq!(trims.load(Ordering::SeqCst), 1, "a busy daemon");
        wait(3).await;
        assert_eq!(trims.load(Ordering::SeqCst), 2);
        wait(5).await;
        assert_eq!(trims.load(Ordering::SeqCst), 2, "once a burst");
        task.abort();
    }
}
