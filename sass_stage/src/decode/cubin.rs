//! The cubin (an ELF file) as far as reordering needs it: which architecture it is
//! for, where each kernel's `.text.<name>` lies in the file, the instruction offsets
//! its `.nv.info.<name>` attributes name, and the words under relocations. A reordered
//! kernel is written back by overwriting the text section's bytes in place; nothing
//! else in the file changes, so symbols, attributes and sizes stay valid.

use crate::SassError;
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSection, ObjectSymbol};
use std::collections::BTreeSet;

/// Bytes of one SASS instruction on Volta and later.
pub const WORD_BYTES: usize = 16;

/// `.nv.info.<kernel>` attributes whose payload is a list of instruction offsets that
/// the driver or tools rely on (see `shared/REFERENCE.md`): exits, CTA-id reads, cache
/// modifiers, cooperative groups, warp-wide intrinsics, indirect branch targets,
/// mbarriers, syscalls, membar workarounds. For the composite ones every 32-bit value
/// is read as an offset, which can only pin more.
const OFFSET_ATTRIBUTES: [u8; 9] = [0x1c, 0x1d, 0x25, 0x28, 0x31, 0x34, 0x39, 0x46, 0x47];

/// One kernel's code inside the cubin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelText {
    pub name: String,
    /// Byte offset of `.text.<name>` in the file.
    pub file_offset: usize,
    /// The section's instructions as (low, high) 64-bit halves.
    pub words: Vec<(u64, u64)>,
    /// Instruction offsets (bytes from the section start) named by `.nv.info.<name>`.
    pub info_offsets: BTreeSet<usize>,
    /// Instruction offsets that a relocation patches.
    pub relocated: BTreeSet<usize>,
}

/// A parsed cubin: the file's bytes, its SM version and its kernels.
#[derive(Debug, Clone)]
pub struct Cubin {
    bytes: Vec<u8>,
    /// e.g. 90 for sm_90.
    pub sm: u32,
    pub kernels: Vec<String>,
}

impl Cubin {
    /// Parses `bytes`, refusing anything that is not a 64-bit CUDA ELF for sm_90.
    pub fn parse(bytes: Vec<u8>) -> Result<Cubin, SassError> {
        let bad = |why: String| SassError::Input(format!("not a usable cubin: {why}"));
        let file = ElfFile64::<Endianness>::parse(&*bytes).map_err(|e| bad(e.to_string()))?;
        // Raw header fields (the file parsed as ELF64, so they are in bounds): CUDA's
        // OS/ABI is 0x33 in old toolkits and 0x41 with ABI version 8 (CUDA 12.8 on);
        // the SM version sits in e_flags' low byte, or its second byte from version 8.
        let osabi = bytes[7];
        if osabi != 0x33 && osabi != 0x41 {
            return Err(bad(format!("ELF OS/ABI {osabi:#x} is not CUDA's")));
        }
        if bytes[5] != 1 {
            return Err(bad("big-endian ELF".to_string()));
        }
        let flags = u32::from_le_bytes([bytes[48], bytes[49], bytes[50], bytes[51]]);
        let sm = if bytes[8] >= 8 {
            (flags >> 8) & 0xff
        } else {
            flags & 0xff
        };
        if sm != 90 {
            return Err(SassError::Input(format!(
                "the cubin is for sm_{sm}; the SASS stage handles sm_90 only"
            )));
        }
        let kernels = file
            .sections()
            .filter_map(|s| s.name().ok()?.strip_prefix(".text.").map(str::to_string))
            .collect();
        Ok(Cubin { bytes, sm, kernels })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The text of `kernel` with its pinned offsets.
    pub fn kernel(&self, kernel: &str) -> Result<KernelText, SassError> {
        let file = ElfFile64::<Endianness>::parse(&*self.bytes)
            .map_err(|e| SassError::Input(e.to_string()))?;
        let missing = || {
            SassError::Input(format!(
                "kernel {kernel} is not in the cubin (it has: {})",
                self.kernels.join(", ")
            ))
        };
        let text = file
            .section_by_name(&format!(".text.{kernel}"))
            .ok_or_else(missing)?;
        let data = text.data().map_err(|e| SassError::Input(e.to_string()))?;
        let (file_offset, size) = text.file_range().ok_or_else(missing)?;
        if data.len() % WORD_BYTES != 0 {
            return Err(SassError::Input(format!(
                ".text.{kernel} is {} bytes, not a whole number of instructions",
                data.len()
            )));
        }
        debug_assert_eq!(size as usize, data.len());
        let half = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let words = data
            .chunks_exact(WORD_BYTES)
            .map(|w| (half(&w[..8]), half(&w[8..])))
            .collect();
        let info_offsets = match file.section_by_name(&format!(".nv.info.{kernel}")) {
            Some(info) => {
                let data = info.data().map_err(|e| SassError::Input(e.to_string()))?;
                gpu::cubin::attributes(data)
                    .filter(|(attr, _)| OFFSET_ATTRIBUTES.contains(attr))
                    .flat_map(|(_, payload)| {
                        payload
                            .chunks_exact(4)
                            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                    })
                    .filter(|&o| o % WORD_BYTES == 0 && o < data.len().max(size as usize))
                    .collect()
            }
            None => BTreeSet::new(),
        };
        let relocated = text
            .relocations()
            .map(|(offset, _)| offset as usize / WORD_BYTES * WORD_BYTES)
            .collect();
        // The symbol must exist too, or the driver could not launch the kernel.
        if !file.symbols().any(|s| s.name() == Ok(kernel)) {
            return Err(missing());
        }
        Ok(KernelText {
            name: kernel.to_string(),
            file_offset: file_offset as usize,
            words,
            info_offsets,
            relocated,
        })
    }

    /// A copy of the cubin with `kernel`'s text replaced by `words` (same length).
    pub fn with_text(&self, kernel: &KernelText, words: &[(u64, u64)]) -> Vec<u8> {
        assert_eq!(
            words.len(),
            kernel.words.len(),
            "a reorder keeps the length"
        );
        let mut bytes = self.bytes.clone();
        for (i, (lo, hi)) in words.iter().enumerate() {
            let at = kernel.file_offset + i * WORD_BYTES;
            bytes[at..at + 8].copy_from_slice(&lo.to_le_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&hi.to_le_bytes());
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_other_elves_are_refused_with_one_message() {
        let e = Cubin::parse(b"hello, not an ELF".to_vec()).unwrap_err();
        assert!(e.to_string().starts_with("not a usable cubin"), "{e}");
        // This test binary is an ELF, but not CUDA's.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let e = Cubin::parse(me).unwrap_err();
        assert!(e.to_string().contains("not CUDA's"), "{e}");
    }
}
