//! Where a kernel's hot loop spends its issue cycles, by instruction class.
//!
//! The stall count of each instruction is the number of cycles its warp waits before
//! issuing the next one, so their sum over a loop body is what one iteration costs a
//! warp in issue slots before any scoreboard wait. Splitting it by class shows what
//! the second stage can reach: stalls between MMAs and memory instructions are its
//! to trade; cycles spent on integer address arithmetic and loop control belong to the
//! instructions stage 1's source asked for, which no reordering removes.

use crate::legality::analysis::Kernel;
use serde::Serialize;

/// Instruction classes, in report order.
pub const CLASSES: [&str; 5] = ["mma/fma", "memory", "integer", "control", "other"];

/// One class's share of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClassShare {
    pub class: &'static str,
    pub instructions: usize,
    /// Sum of the class's stall counts.
    pub cycles: u32,
}

/// The issue profile of one block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IssueProfile {
    pub block: usize,
    pub instructions: usize,
    pub cycles: u32,
    pub classes: Vec<ClassShare>,
}

/// The class of a base opcode.
pub fn class_of(base: &str) -> &'static str {
    match base {
        "HMMA" | "IMMA" | "HGMMA" | "FFMA" | "FMUL" | "FADD" | "HFMA2" | "HADD2" | "HMUL2"
        | "DFMA" => "mma/fma",
        "LDG" | "STG" | "LDS" | "STS" | "LDSM" | "LDGSTS" | "LDL" | "STL" | "LDC" | "RED"
        | "REDG" | "ATOM" | "ATOMS" | "ATOMG" => "memory",
        "BRA" | "BAR" | "DEPBAR" | "LDGDEPBAR" | "EXIT" | "BSSY" | "BSYNC" | "WARPSYNC" | "NOP"
        | "YIELD" | "RET" | "CALL" => "control",
        b if b.starts_with('I')
            || b.starts_with('U')
            || b.starts_with('P')
            || matches!(
                b,
                "VIADD"
                    | "LEA"
                    | "LOP3"
                    | "SHF"
                    | "SEL"
                    | "MOV"
                    | "PRMT"
                    | "S2R"
                    | "S2UR"
                    | "CS2R"
                    | "R2P"
                    | "R2UR"
                    | "FSEL"
                    | "F2FP"
                    | "F2I"
                    | "I2F"
            ) =>
        {
            "integer"
        }
        _ => "other",
    }
}

impl Kernel {
    /// The issue profile of block `block` in the original order.
    pub fn issue_profile(&self, block: usize) -> IssueProfile {
        let range = self.blocks[block].clone();
        let mut classes: Vec<ClassShare> = CLASSES
            .iter()
            .map(|&class| ClassShare {
                class,
                instructions: 0,
                cycles: 0,
            })
            .collect();
        for i in range.clone() {
            let ins = &self.instructions[i];
            let class = class_of(&ins.base);
            let share = classes
                .iter_mut()
                .find(|c| c.class == class)
                .expect("every class is listed");
            share.instructions += 1;
            share.cycles += u32::from(ins.control.stall);
        }
        IssueProfile {
            block,
            instructions: range.len(),
            cycles: classes.iter().map(|c| c.cycles).sum(),
            classes,
        }
    }
}

impl IssueProfile {
    /// The share of `class` in the block's issue cycles (0 when it has none).
    pub fn cycle_share(&self, class: &str) -> f64 {
        let c = self.classes.iter().find(|c| c.class == class);
        match c {
            Some(c) if self.cycles > 0 => f64::from(c.cycles) / f64::from(self.cycles),
            _ => 0.0,
        }
    }

    /// One line: instructions and issue cycles, then each class's share.
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .classes
            .iter()
            .filter(|c| c.instructions > 0)
            .map(|c| {
                format!(
                    "{} {} instr. {:.0}%",
                    c.class,
                    c.instructions,
                    100.0 * self.cycle_share(c.class)
                )
            })
            .collect();
        format!(
            "hot loop (block {}): {} instructions, {} issue cycles per iteration; {}",
            self.block,
            self.instructions,
            self.cycles,
            parts.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::legality::testkit::kernel_of;

    #[test]
    fn cycles_split_by_class() {
        let k = kernel_of(&[
            ("IMAD R8, R9, R10, R8", 4, 0),
            ("HMMA.16816.F32 R20, R4, R6, R20", 2, 0),
            ("LDSM.16.M88.4 R4, [R2]", 2, 0),
            ("LEA R9, R8, R9, 0x2", 2, 0),
            ("EXIT", 5, 0),
        ]);
        let p = k.issue_profile(k.hot_block());
        assert_eq!(p.cycles, 15);
        assert_eq!(p.instructions, 5);
        let get = |c: &str| *p.classes.iter().find(|s| s.class == c).unwrap();
        assert_eq!((get("integer").instructions, get("integer").cycles), (2, 6));
        assert_eq!((get("mma/fma").instructions, get("mma/fma").cycles), (1, 2));
        assert_eq!(get("control").cycles, 5);
        assert!((p.cycle_share("integer") - 0.4).abs() < 1e-12);
        assert!(p.line().contains("integer 2 instr. 40%"), "{}", p.line());
    }
}
