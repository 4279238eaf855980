//! Reading a kernel out of a cubin: the ELF file and each kernel's text section
//! (`cubin`), the instruction text from NVIDIA's disassembler (`disasm`), the control
//! bits every instruction word carries (`control`), and the registers, memory spaces
//! and opcode class of each instruction (`instr`). Nothing here decides what may move;
//! it only turns bytes into facts, and facts back into bytes.

pub mod control;
pub mod cubin;
pub mod disasm;
pub mod instr;
