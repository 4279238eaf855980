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

/// A synthetic objective for the agents' tests: the time falls 1% per yielding FFMA
/// and rises 0.5% per stall cycle added over the original; nothing else matters.
/// Distinct orders count against the budget, as measurements do.
pub struct Formula {
    pub budget: usize,
    seen: std::collections::HashSet<String>,
}

impl Formula {
    pub fn new(budget: usize) -> Formula {
        Formula {
            budget,
            seen: Default::default(),
        }
    }

    pub fn time(kernel: &Kernel, order: &crate::legality::order::Order) -> f64 {
        let (mut yields, mut added) = (0.0, 0.0);
        for i in 0..kernel.len() {
            let (o, c) = (kernel.instructions[i].control, kernel.control(order, i));
            if kernel.instructions[i].base == "FFMA" && kernel.rules.yields(&c) {
                yields += 1.0;
            }
            added += f64::from(c.stall) - f64::from(o.stall);
        }
        100.0 * (1.0 - 0.01 * yields + 0.005 * added)
    }
}

impl crate::agents::objective::Objective for Formula {
    fn evaluate(
        &mut self,
        kernel: &Kernel,
        order: &crate::legality::order::Order,
    ) -> Result<crate::agents::objective::Evaluation, crate::SassError> {
        self.seen
            .insert(crate::agents::objective::text_hash(kernel, order));
        Ok(crate::agents::objective::Evaluation::Time(Formula::time(
            kernel, order,
        )))
    }

    fn used(&self) -> usize {
        self.seen.len()
    }

    fn budget(&self) -> usize {
        self.budget
    }
}
