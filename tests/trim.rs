//! The idle heap trim (`src/server/trim.rs`) hands freed heap memory back to the system. Its own test
//! binary: it reads this process's resident memory, which tests running beside it would disturb.

/// Memory freed to the heap and not given back by glibc is given back by a trim.
#[cfg(target_env = "gnu")]
#[test]
fn a_trim_hands_back_freed_heap_memory() {
    // Many blocks below glibc's mmap threshold (128 KiB at first), touched, then freed: they stay
    // in the heap (the top one may be trimmed on free, the rest not).
    let blocks: Vec<Vec<u8>> = (0..2048).map(|i| vec![i as u8 | 1; 100 << 10]).collect();
    let keep: Vec<Vec<u8>> = blocks.iter().step_by(512).cloned().collect();
    drop(blocks);
    let (before, after, _) = vserve::server::trim::trim();
    assert!(before > 0, "VmRSS read");
    assert!(
        after + (100 << 20) < before,
        "a trim handed back {} of about 200 MiB freed",
        before.saturating_sub(after)
    );
    assert!(keep.iter().all(|b| b.iter().all(|&x| x != 0)));
}
