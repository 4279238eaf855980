//! Occupancy and waves: how many blocks of a kernel an SM holds at once, which resource
//! limits it, and how well the grid fills the GPU's block slots.
//!
//! The rules are those of CUDA's occupancy calculator for sm_90: threads are allocated
//! per warp; every block's shared memory is rounded up to 128 bytes and carries 1 KB
//! reserved by the system (sm_80 and later); registers are allocated per warp in units
//! of 256 from one of the SM's four sub-partitions (a warp lives on one scheduler), and a
//! block over the per-block register file cannot launch.

use schedule::GpuSpec;

/// Shared memory the system reserves per block on sm_80 and later (bytes).
const RESERVED_SHARED_BYTES: u64 = 1024;
/// Shared-memory allocation granularity (bytes).
const SHARED_ALLOCATION_UNIT: u64 = 128;
/// Register allocation granularity per warp (registers).
const REGISTER_ALLOCATION_UNIT: u64 = 256;
/// Warp schedulers (and register-file sub-partitions) per SM.
pub(crate) const SCHEDULERS_PER_SM: u64 = 4;

/// Resident blocks per SM and what limits them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Occupancy {
    pub by_threads: u64,
    pub by_shared: u64,
    pub by_registers: u64,
    /// The SM's cap on resident blocks.
    pub block_cap: u64,
    pub blocks_per_sm: u64,
    pub warps_per_block: u64,
    pub active_warps: u64,
    pub max_warps: u64,
}

impl Occupancy {
    /// Occupancy of a kernel with `threads` per block, `shared_bytes` of dynamic shared
    /// memory and `registers` per thread. A block that cannot launch at all (too many
    /// threads, shared memory over the opt-in limit, registers over the per-block file)
    /// gives 0 blocks per SM.
    pub(crate) fn new(gpu: &GpuSpec, threads: u64, shared_bytes: u64, registers: u64) -> Self {
        let warp = u64::from(gpu.warp_size).max(1);
        let warps_per_block = threads.div_ceil(warp).max(1);
        let max_warps = u64::from(gpu.max_threads_per_sm) / warp;
        let by_threads = if threads > u64::from(gpu.max_threads_per_block) {
            0
        } else {
            max_warps / warps_per_block
        };
        let by_shared = if shared_bytes > u64::from(gpu.shared_bytes_per_block_optin) {
            0
        } else {
            let per_block =
                (shared_bytes + RESERVED_SHARED_BYTES).next_multiple_of(SHARED_ALLOCATION_UNIT);
            u64::from(gpu.shared_bytes_per_sm) / per_block
        };
        let by_registers =
            if registers * warps_per_block * warp > u64::from(gpu.registers_per_block) {
                0
            } else {
                let per_warp = (registers.max(1) * warp).next_multiple_of(REGISTER_ALLOCATION_UNIT);
                let per_partition = u64::from(gpu.registers_per_sm) / SCHEDULERS_PER_SM;
                (per_partition / per_warp) * SCHEDULERS_PER_SM / warps_per_block
            };
        let block_cap = u64::from(gpu.max_blocks_per_sm);
        let blocks_per_sm = by_threads.min(by_shared).min(by_registers).min(block_cap);
        Occupancy {
            by_threads,
            by_shared,
            by_registers,
            block_cap,
            blocks_per_sm,
            warps_per_block,
            active_warps: blocks_per_sm * warps_per_block,
            max_warps,
        }
    }

    /// Resident warps over the SM's maximum.
    pub(crate) fn fraction(&self) -> f64 {
        self.active_warps as f64 / self.max_warps.max(1) as f64
    }
}

/// Waves of `blocks` over `slots` = blocks per SM x SMs, and the fraction of the block
/// slots of those waves that hold a block (0 when no block fits on an SM).
pub(crate) fn waves(blocks: u64, slots: u64) -> (f64, f64) {
    if slots == 0 {
        return (0.0, 0.0);
    }
    let waves = blocks as f64 / slots as f64;
    let efficiency = blocks as f64 / (blocks.div_ceil(slots) * slots) as f64;
    (waves, efficiency)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_limited_by_threads() {
        let o = Occupancy::new(&GpuSpec::h100(), 1024, 4096, 32);
        assert_eq!((o.by_threads, o.blocks_per_sm), (2, 2));
        assert_eq!(o.active_warps, 64);
        assert_eq!(o.fraction(), 1.0);
    }

    #[test]
    fn shared_memory_counts_the_reserved_kilobyte() {
        // 113 KB + 1 KB reserved fits twice into 228 KB; 114 KB does not.
        let gpu = GpuSpec::h100();
        assert_eq!(Occupancy::new(&gpu, 128, 113 * 1024, 32).by_shared, 2);
        assert_eq!(Occupancy::new(&gpu, 128, 114 * 1024, 32).by_shared, 1);
        assert_eq!(Occupancy::new(&gpu, 128, 228 * 1024, 32).by_shared, 0);
    }

    #[test]
    fn registers_are_allocated_per_warp_and_sub_partition() {
        let gpu = GpuSpec::h100();
        // 168 registers: 5376 per warp, 3 warps per sub-partition, 12 per SM.
        let o = Occupancy::new(&gpu, 256, 0, 168);
        assert_eq!(o.by_registers, 1);
        // 170 registers round up to 5632 per warp: still 2 per sub-partition.
        assert_eq!(Occupancy::new(&gpu, 128, 0, 170).by_registers, 2);
        // Over the per-block register file: cannot launch.
        assert_eq!(Occupancy::new(&gpu, 1024, 0, 72).by_registers, 0);
    }

    #[test]
    fn one_warp_blocks_hit_the_block_cap() {
        let o = Occupancy::new(&GpuSpec::h100(), 32, 1024, 32);
        assert_eq!(o.blocks_per_sm, 32);
        assert_eq!(o.block_cap, 32);
        assert!(o.by_threads > 32 && o.by_registers > 32);
    }

    #[test]
    fn wave_efficiency_of_one_block_past_a_full_wave() {
        let (w, e) = waves(133, 132);
        assert!((w - 133.0 / 132.0).abs() < 1e-12);
        assert!((e - 133.0 / 264.0).abs() < 1e-12);
        assert_eq!(waves(264, 132), (2.0, 1.0));
        assert_eq!(waves(10, 0), (0.0, 0.0));
    }
}
