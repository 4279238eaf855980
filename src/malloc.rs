//! glibc's malloc told to keep the memory it frees. NVRTC allocates and frees large
//! blocks for every kernel; by default glibc maps large blocks on their own and hands
//! the free memory at the top of each thread's arena back to the kernel, and the next
//! compile on that thread faults it in again. Kept, on one H200 host of 16 cores, 1536
//! resnet f32 kernels built by `tune` on 12 threads took 4-7% less wall time and CPU,
//! with 40% fewer page faults (`benchmarks/results/h200-2026-11-29/builds/`). The cost
//! is memory: each thread's arena keeps its peak.

/// The largest allocation served from an arena rather than mapped on its own: the
/// highest mallopt accepts (half of a thread arena's 64 MiB). Setting the trim threshold
/// turns off glibc's own growth of this threshold, which would otherwise reach the same
/// value as large blocks are freed.
const MMAP_THRESHOLD: i32 = 32 << 20;

/// Never trims the heap's top, and grows it 64 MiB at a time (glibc's `MALLOC_TRIM_THRESHOLD_`
/// and `MALLOC_TOP_PAD_`, which take precedence where set). Call before any thread starts.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let set = |name: &str| std::env::var_os(name).is_some();
        // SAFETY: mallopt only sets malloc's tuning parameters; with valid parameter
        // numbers it has no preconditions and fails harmlessly (returns 0).
        unsafe {
            if !set("MALLOC_TRIM_THRESHOLD_") {
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            }
            if !set("MALLOC_TOP_PAD_") {
                libc::mallopt(libc::M_TOP_PAD, 64 << 20);
            }
            if !set("MALLOC_MMAP_THRESHOLD_") {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            }
        }
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::keep_freed_memory;
    use std::process::Command;

    /// Set in the child process that runs `cycles`: "keep" calls `keep_freed_memory`
    /// first, anything else leaves glibc as it is.
    const CHILD: &str = "TILESCHED_MALLOC_TEST_CHILD";

    /// Minor page faults of the calling thread so far.
    fn thread_faults() -> u64 {
        crate::usage::this_thread()
            .expect("getrusage of this thread")
            .minor_faults
    }

    /// In the child: what a compile does to the allocator, six times over (160 blocks
    /// of 100 KiB written, then freed), and the page faults of all but the first time.
    #[test]
    fn cycles() {
        let Ok(mode) = std::env::var(CHILD) else {
            return; // only in the child
        };
        if mode == "keep" {
            keep_freed_memory();
        }
        let mut after_first = 0;
        for cycle in 0..6 {
            let before = thread_faults();
            let blocks: Vec<Vec<u8>> = (0..160).map(|i| vec![i as u8; 100 << 10]).collect();
            std::hint::black_box(&blocks);
            drop(blocks);
            if cycle > 0 {
                after_first += thread_faults() - before;
            }
        }
        println!("faults after the first cycle: {after_first}");
    }

    fn faults_in_child(mode: &str) -> u64 {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "malloc::tests::cycles",
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD, mode)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // libtest prints the test's name on the same line.
        let line = text
            .lines()
            .find_map(|l| l.split("faults after the first cycle: ").nth(1))
            .unwrap_or_else(|| panic!("no count in the child's output: {text}"));
        line.trim().parse().unwrap()
    }

    #[test]
    fn freed_memory_is_reused_without_faulting_it_in_again() {
        // 16 MiB a cycle is 4096 pages: glibc as it is faults them in every time.
        let kept = faults_in_child("keep");
        let default = faults_in_child("default");
        assert!(kept < 500, "kept: {kept} faults in five cycles");
        assert!(
            default > 5 * 2000,
            "glibc as is: {default} faults (the test would not tell)"
        );
    }
}
