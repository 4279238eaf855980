//! Synthetic kernels for the unit tests of the legality rules and the agents.

use crate::decode::control::Control;
use crate::decode::cubin::KernelText;
use crate::decode::disasm::Line;
use crate::legality::analysis::Kernel;

/// Control bits: stall, write barrier, wait mask (no yield, no reuse).
pub fn ctl(stall: u8, write_barrier: Option<u8>, wait_mask: u8) -> Control {
    Control {
        stall,
        yield_bit: true,
        write_barrier,
        read_barrier: None,
        wait_mask,
        reuse: 0,
    }
}

/// A kernel of one text line and control bits per instruction.
pub fn kernel(code: &[(&str, Control)]) -> Kernel {
    let lines: Vec<Line> = code
        .iter()
        .enumerate()
        .map(|(i, (text, c))| Line {
            offset: i * 16,
            text: text.to_string(),
            low: i as u64,
            high: c.encode(0),
            labels: vec![],
        })
        .collect();
    let text = KernelText {
        name: "k".into(),
        file_offset: 0,
        words: lines.iter().map(|l| (l.low, l.high)).collect(),
        info_offsets: Default::default(),
        relocated: Default::default(),
    };
    Kernel::analyze(&text, &lines).unwrap()
}

/// A kernel of (text, stall, reuse flags) without scoreboards.
pub fn kernel_of(code: &[(&str, u8, u8)]) -> Kernel {
    let code: Vec<(&str, Control)> = code
        .iter()
        .map(|&(text, stall, reuse)| {
            let mut c = ctl(stall, None, 0);
            c.reuse = reuse;
            (text, c)
        })
        .collect();
    kernel(&code)
}
