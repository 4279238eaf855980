//! Resource usage of a compiled kernel.
//!
//! Registers and the stack frame come from the cubin (an ELF file): the global
//! `.nv.info` section holds `EIATTR_REGCOUNT` (0x2f) and `EIATTR_FRAME_SIZE` (0x11)
//! records keyed by the kernel's symbol index. Spill traffic and static shared memory
//! come from ptxas's verbose report in the compile log (the cubin's `.nv.shared.<k>`
//! section also counts the 1 KB that sm_90 reserves per block).

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
