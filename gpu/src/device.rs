//! What a measurement is tied to: the device's name, size and clocks, and the driver.
//! Every tuning record carries one, so that figures from different GPUs never mix.

use crate::cuda::{self, Context, CudaError};
use cudarc::driver::sys::CUdevice_attribute as Attr;
use schedule::GpuSpec;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One GPU as the measurement worker sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Ordinal of the device in this process's CUDA enumeration.
    pub ordinal: u32,
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    /// Peak SM clock (the driver's `CLOCK_RATE`).
    pub sm_clock_mhz: u32,
    /// Peak memory clock.
    pub memory_clock_mhz: u32,
    pub memory_bus_bits: u32,
    pub memory_bytes: u64,
    pub l2_bytes: u64,
    /// Dynamic shared memory a block may opt in to.
    pub shared_bytes_per_block_optin: u32,
    /// CUDA version the driver implements, e.g. "13.0".
    pub cuda_driver: String,
    /// Kernel-module driver version, e.g. "580.159.04" (Linux), when readable.
    #[serde(default)]
    pub kernel_driver: Option<String>,
}

impl DeviceInfo {
    /// The architecture NVRTC compiles for, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }

    /// The hardware description schedules are validated and featurized against: the
    /// built-in table of the device's architecture (sm_90: the H200's for an H200, the
    /// H100's otherwise; both hold the same SM limits) with the device's own name, SM
    /// count and opt-in shared memory. Other architectures have no table yet: their
    /// limits (shared memory per SM, threads per SM) differ, and validating against
    /// the wrong ones would admit kernels that cannot launch.
    pub fn spec(&self) -> Result<GpuSpec, UnknownArch> {
        let table = match self.compute_capability {
            (9, 0) if self.name.contains("H200") => GpuSpec::h200(),
            (9, 0) => GpuSpec::h100(),
            _ => {
                return Err(UnknownArch {
                    name: self.name.clone(),
                    arch: self.arch(),
                });
            }
        };
        Ok(GpuSpec {
            name: self.name.clone(),
            compute_capability: self.compute_capability,
            sm_count: self.sm_count,
            shared_bytes_per_block_optin: self.shared_bytes_per_block_optin,
            ..table
        })
    }

    /// Reads the device behind `ctx`.
    pub fn query(ctx: &Context) -> Result<DeviceInfo, CudaError> {
        let attr = |a| ctx.attribute(a).map(|v| v.max(0) as u32);
        Ok(DeviceInfo {
            ordinal: ctx.ordinal,
            name: ctx.name()?,
            compute_capability: (
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            sm_clock_mhz: attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? / 1000,
            memory_clock_mhz: attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? / 1000,
            memory_bus_bits: attr(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?,
            memory_bytes: ctx.total_memory()? as u64,
            l2_bytes: u64::from(attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?),
            shared_bytes_per_block_optin: attr(
                Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
            cuda_driver: cuda::driver_cuda_version()?,
            kernel_driver: kernel_driver_version(),
        })
    }
}

/// A device whose architecture has no built-in hardware table.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("no hardware table for {name} ({arch}): tilesched knows sm_90 (H100, H200)")]
pub struct UnknownArch {
    pub name: String,
    pub arch: String,
}

/// The NVIDIA kernel module's version from `/proc/driver/nvidia/version`.
fn kernel_driver_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_kernel_driver(&text)
}

fn parse_kernel_driver(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version"))?;
    line.split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_driver_version_is_read_from_the_proc_file() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  Thu Oct 9 2025\nGCC version:  gcc version 12.3.0\n";
        assert_eq!(parse_kernel_driver(text).as_deref(), Some("580.159.04"));
        assert_eq!(parse_kernel_driver("GCC version: 12.3.0"), None);
    }

    #[test]
    fn the_spec_is_the_table_of_the_architecture_with_the_devices_counts() {
        let mut device = crate::worker::Simulated::device(0);
        device.name = "NVIDIA H200".to_string();
        device.sm_count = 114;
        let spec = device.spec().unwrap();
        assert_eq!(spec.name, "NVIDIA H200");
        assert_eq!(spec.sm_count, 114);
        assert_eq!(spec.max_threads_per_sm, GpuSpec::h200().max_threads_per_sm);
        device.compute_capability = (8, 6);
        device.name = "NVIDIA GeForce RTX 3090".to_string();
        let e = device.spec().unwrap_err();
        assert_eq!(
            e.to_string(),
            "no hardware table for NVIDIA GeForce RTX 3090 (sm_86): tilesched knows sm_90 (H100, H200)"
        );
    }
}
