//! The hardware facts that schedules are validated against and that analytical features
//! are computed for. Read off the device when there is one; the built-in tables hold
//! NVIDIA's published limits for H100 and H200 (SXM).

use crate::invalid::InvalidState;
use serde::{Deserialize, Serialize};

/// Limits and sizes of one GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSpec {
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0) for `sm_90`.
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub warp_size: u32,
    pub max_threads_per_block: u32,
    pub max_threads_per_sm: u32,
    pub max_blocks_per_sm: u32,
    pub registers_per_sm: u32,
    pub registers_per_block: u32,
    pub max_registers_per_thread: u32,
    pub shared_bytes_per_sm: u32,
    /// Dynamic shared memory a block gets without opting in.
    pub shared_bytes_per_block: u32,
    /// Dynamic shared memory a block may use after opting in
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
    pub shared_bytes_per_block_optin: u32,
    pub shared_banks: u32,
    /// Largest product of virtual-thread factors (TVM's `max_vthread_extent`).
    pub max_vthread: u32,
    /// Largest innermost split factor of any axis (Ansor's `max_innermost_split_factor`).
    pub max_innermost_factor: u32,
}

impl GpuSpec {
    /// The limits every sketch's block meets: a grid of at most `i32::MAX` blocks,
    /// `shared_bytes` within the opt-in shared memory, `registers` per thread within
    /// the thread's limit.
    pub fn check_block(
        &self,
        blocks: u64,
        shared_bytes: u64,
        registers: u64,
    ) -> Result<(), InvalidState> {
        if blocks > i32::MAX as u64 {
            return Err(InvalidState::Grid { blocks });
        }
        if shared_bytes > u64::from(self.shared_bytes_per_block_optin) {
            return Err(InvalidState::SharedMemory {
                bytes: shared_bytes,
                max: u64::from(self.shared_bytes_per_block_optin),
            });
        }
        if registers > u64::from(self.max_registers_per_thread) {
            return Err(InvalidState::Registers {
                registers,
                max: u64::from(self.max_registers_per_thread),
            });
        }
        Ok(())
    }

    /// NVIDIA H100 SXM5 (sm_90).
    pub fn h100() -> Self {
        GpuSpec {
            name: "NVIDIA H100".to_string(),
            compute_capability: (9, 0),
            sm_count: 132,
            warp_size: 32,
            max_threads_per_block: 1024,
            max_threads_per_sm: 2048,
            max_blocks_per_sm: 32,
            registers_per_sm: 65536,
            registers_per_block: 65536,
            max_registers_per_thread: 255,
            shared_bytes_per_sm: 228 * 1024,
            shared_bytes_per_block: 48 * 1024,
            shared_bytes_per_block_optin: 227 * 1024,
            shared_banks: 32,
            max_vthread: 8,
            max_innermost_factor: 64,
        }
    }

    /// NVIDIA H200 (sm_90): the H100's SM array with more, faster HBM.
    pub fn h200() -> Self {
        GpuSpec {
            name: "NVIDIA H200".to_string(),
            ..Self::h100()
        }
    }

    /// The built-in table for a name such as `h100`, `H200`, `sm_90`.
    pub fn builtin(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "h100" | "sm_90" | "sm90" => Some(Self::h100()),
            "h200" => Some(Self::h200()),
            _ => None,
        }
    }

    /// The `sm_XY` architecture name that NVRTC compiles for.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}
