//! Test fixtures: cubin-shaped ELF files whose kernel records the parameters a test
//! chooses, for tests of deploy caches that need no compiler.

use object::write::Object;
use object::{Architecture, BinaryFormat, Endianness, SectionKind};

/// A pointer parameter's bytes.
pub(crate) const POINTER: u32 = 8;
/// A tensor map parameter's bytes.
pub(crate) const MAP: u32 = 128;

/// An ELF file holding `.nv.info.<kernel>` with an `EIATTR_KPARAM_INFO` record per
/// parameter of `sizes` (bytes), written as ptxas writes them (last parameter first,
/// each at its place), and `tag` in a section of its own: files of one kernel that
/// differ.
pub(crate) fn cubin(kernel: &str, sizes: &[u32], tag: u8) -> Vec<u8> {
    // sm_90's parameters start at 0x210 in the constant bank, where a pointer lies at a
    // multiple of 8 bytes and a tensor map of 64.
    const BASE: u32 = 0x210;
    let mut records = Vec::new();
    let mut offset = 0;
    for (ordinal, &size) in sizes.iter().enumerate() {
        offset = u32::next_multiple_of(BASE + offset, size.min(64)) - BASE;
        let mut record = vec![0x04, 0x17, 12, 0, 0, 0, 0, 0];
        record.extend((ordinal as u16).to_le_bytes());
        record.extend((offset as u16).to_le_bytes());
        // The size in the top 14 bits, over the constant bank (0x1f) ptxas writes.
        record.extend((size << 18 | 0x1f << 12).to_le_bytes());
        records.push(record);
        offset += size;
    }
    let info: Vec<u8> = records.into_iter().rev().flatten().collect();
    let mut elf = Object::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
    let section = elf.add_section(
        Vec::new(),
        format!(".nv.info.{kernel}").into_bytes(),
        SectionKind::Metadata,
    );
    elf.set_section_data(section, info, 4);
    let tagged = elf.add_section(Vec::new(), b".tag".to_vec(), SectionKind::Metadata);
    elf.set_section_data(tagged, vec![tag], 1);
    elf.write().expect("an ELF file of two sections")
}

#[test]
fn a_fixture_reads_back_as_its_parameters() {
    let file = cubin("k", &[POINTER, POINTER, MAP, MAP], 1);
    let params = gpu::cubin::kernel_params(&file, "k").unwrap();
    let read: Vec<(u32, u32)> = params.iter().map(|p| (p.offset, p.size)).collect();
    assert_eq!(read, [(0, 8), (8, 8), (48, 128), (176, 128)]);
    assert_ne!(file, cubin("k", &[POINTER, POINTER, MAP, MAP], 2));
    let err = gpu::cubin::kernel_params(&file, "other").unwrap_err();
    assert_eq!(err.to_string(), "no .nv.info.other section");
}
