//! What a compiled kernel's cubin (an ELF file) says about it: its resource usage and
//! its parameters.
//!
//! Registers and the stack frame: the global `.nv.info` section holds
//! `EIATTR_REGCOUNT` (0x2f) and `EIATTR_FRAME_SIZE` (0x11) records keyed by the kernel's
//! symbol index. Spill traffic and static shared memory come from ptxas's verbose report
//! in the compile log (the cubin's `.nv.shared.<k>` section also counts the 1 KB that
//! sm_90 reserves per block).
//!
//! Parameters: the kernel's own `.nv.info.<kernel>` section holds one
//! `EIATTR_KPARAM_INFO` (0x17) record per parameter, whose 12-byte payload is a 32-bit
//! index (0), the parameter's 16-bit ordinal and 16-bit offset in the parameter space,
//! then 32 bits of flags whose top 14 bits are its size in bytes. This is what the
//! driver learns a kernel's parameters from, so a launch can be checked against it
//! without a GPU.

use object::{Object, ObjectSymbol};

/// What the compiled kernel uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Resources {
    pub registers: u32,
    /// Per-thread stack frame in bytes; nonzero means local memory is used.
    pub stack_frame_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    pub static_shared_bytes: u32,
}

const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_REGCOUNT: u8 = 0x2f;
/// Record format whose 16-bit header field is a payload length (EIFMT_SVAL).
const EIFMT_SVAL: u8 = 0x04;

/// Why a cubin's resources cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CubinError {
    #[error("{0}")]
    Elf(String),
    #[error("no symbol {0}")]
    NoSymbol(String),
    #[error(".nv.info missing")]
    NoInfo,
    #[error("no register count for the kernel")]
    NoRegisterCount,
    #[error("no .nv.info.{0} section")]
    NoKernelInfo(String),
    /// The kernel's parameter records are missing or do not describe parameters
    /// 0 to n-1 once each.
    #[error("its EIATTR_KPARAM_INFO records {0}")]
    ParamRecords(String),
}

/// One kernel parameter as the cubin records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelParam {
    /// Byte offset in the kernel's parameter space.
    pub offset: u32,
    /// Bytes: 8 for a pointer, 128 for a `CUtensorMap`.
    pub size: u32,
}

/// The parameters of `kernel`, in order, from its `.nv.info.<kernel>` section. A kernel
/// without records is an error: every kernel this project launches takes buffers, so
/// none means a cubin stripped of them, not a kernel without parameters.
pub fn kernel_params(cubin: &[u8], kernel: &str) -> Result<Vec<KernelParam>, CubinError> {
    let elf = |e: object::Error| CubinError::Elf(e.to_string());
    let file = object::File::parse(cubin).map_err(elf)?;
    let section = file
        .section_by_name(&format!(".nv.info.{kernel}"))
        .ok_or_else(|| CubinError::NoKernelInfo(kernel.to_string()))?;
    let data = object::ObjectSection::data(&section).map_err(elf)?;
    let bad = |why: String| CubinError::ParamRecords(why);
    let mut params: Vec<(u16, KernelParam)> = Vec::new();
    for (_, payload) in attributes(data).filter(|&(attr, _)| attr == EIATTR_KPARAM_INFO) {
        let [_, _, _, _, o0, o1, f0, f1, s0, s1, s2, s3, ..] = *payload else {
            return Err(bad(format!("include one of {} bytes", payload.len())));
        };
        let flags = u32::from_le_bytes([s0, s1, s2, s3]);
        params.push((
            u16::from_le_bytes([o0, o1]),
            KernelParam {
                offset: u32::from(u16::from_le_bytes([f0, f1])),
                size: flags >> 18,
            },
        ));
    }
    if params.is_empty() {
        return Err(bad("are missing".to_string()));
    }
    // ptxas writes them last parameter first.
    params.sort_by_key(|&(ordinal, _)| ordinal);
    if params
        .iter()
        .enumerate()
        .any(|(i, &(o, _))| usize::from(o) != i)
    {
        let ordinals: Vec<String> = params.iter().map(|(o, _)| o.to_string()).collect();
        return Err(bad(format!(
            "name parameters {}, not 0 to {} once each",
            ordinals.join(", "),
            params.len() - 1
        )));
    }
    Ok(params.into_iter().map(|(_, p)| p).collect())
}

/// Reads the resources of `kernel` from its cubin and NVRTC's log.
pub fn resources(cubin: &[u8], kernel: &str, log: &str) -> Result<Resources, CubinError> {
    let elf = |e: object::Error| CubinError::Elf(e.to_string());
    let file = object::File::parse(cubin).map_err(elf)?;
    let symbol = file
        .symbols()
        .find(|s| s.name() == Ok(kernel))
        .ok_or_else(|| CubinError::NoSymbol(kernel.to_string()))?
        .index()
        .0 as u32;
    let info = file.section_by_name(".nv.info").ok_or(CubinError::NoInfo)?;
    let data = object::ObjectSection::data(&info).map_err(elf)?;
    let value = |wanted: u8| {
        attributes(data)
            .filter(|&(attr, _)| attr == wanted)
            .filter_map(|(_, p)| Some((le_u32(p.get(0..4)?), le_u32(p.get(4..8)?))))
            .find(|&(sym, _)| sym == symbol)
            .map(|(_, v)| v)
    };
    let registers = value(EIATTR_REGCOUNT).ok_or(CubinError::NoRegisterCount)?;
    let stack_frame_bytes = value(EIATTR_FRAME_SIZE).unwrap_or(0);
    let number_before = |suffix: &str| -> u32 {
        log.lines()
            .filter_map(|line| {
                let end = line.find(suffix)?;
                line[..end].split_whitespace().last()?.parse().ok()
            })
            .next()
            .unwrap_or(0)
    };
    Ok(Resources {
        registers,
        stack_frame_bytes,
        spill_store_bytes: number_before(" bytes spill stores"),
        spill_load_bytes: number_before(" bytes spill loads"),
        static_shared_bytes: number_before(" bytes smem"),
    })
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

/// Iterates `(attribute, payload)` records of an `.nv.info` section: a format byte, an
/// attribute byte, a 16-bit field (the payload length for EIFMT_SVAL, else the value).
/// The SASS stage reads the per-kernel `.nv.info.<kernel>` sections with it too.
pub fn attributes(data: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        let header = data.get(pos..pos + 4)?;
        let (format, attr) = (header[0], header[1]);
        let len = if format == EIFMT_SVAL {
            u16::from_le_bytes([header[2], header[3]]) as usize
        } else {
            0
        };
        let payload = data.get(pos + 4..pos + 4 + len)?;
        pos += 4 + len;
        Some((attr, payload))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records of a kernel of two pointers and a tensor map, as NVRTC compiles it
    /// (no GPU needed).
    #[test]
    fn parameters_are_read_as_ptxas_records_them() {
        let source = format!(
            "{}\nextern \"C\" __global__ void k(const float* a, float* b, \
             const __grid_constant__ TmaMap m) {{ b[0] = a[0] + float(m.opaque[0]); }}",
            schedule::atom::tma::MAP_TYPE_C
        );
        let cubin = crate::compile(&source, "k", "sm_90").unwrap().cubin;
        let params = kernel_params(&cubin, "k").unwrap();
        let read: Vec<(u32, u32)> = params.iter().map(|p| (p.offset, p.size)).collect();
        // The map 64-byte aligned in the constant bank, where the parameters start at
        // 0x210 on sm_90.
        assert_eq!(read, [(0, 8), (8, 8), (48, 128)]);
        assert_eq!(
            kernel_params(&cubin, "other"),
            Err(CubinError::NoKernelInfo("other".to_string()))
        );
        assert!(matches!(
            kernel_params(b"\x7fELF not one", "k"),
            Err(CubinError::Elf(_))
        ));
    }
}
