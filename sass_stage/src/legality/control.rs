//! Legality of control-bit edits: yield flips, operand-reuse flags and stall counts.
//!
//! Hopper's gains beyond instruction order came from control bits (DeepGEMM flips the
//! yield hint on alternate FFMAs and clears their reuse flags; `shared/REFERENCE.md`).
//! The edits here keep every rule the dependency analysis proves, so that an edited
//! kernel computes bit for bit what the original computes:
//!
//! - **stall counts** may grow freely (up to 15); they may shrink only while every
//!   distance constraint spanning the instruction (fixed-latency producer → consumer,
//!   scoreboard set → wait, late operand read → next writer, untracked results such as
//!   HMMA's, block edges) keeps its required cycles, and never below the smallest stall
//!   ptxas gave the same pair of opcodes anywhere in the kernel (or that opcode, when
//!   the pair never occurs). Wait masks and scoreboards are never edited, so no wait a
//!   consumer relies on can go.
//! - **yield** may flip on any unpinned instruction; an instruction that yields loses
//!   its reuse flags (a warp that yields cannot keep reuse-cached operands). Which raw
//!   value yields is read off the kernel: the one no reuse-flagged instruction carries.
//! - **reuse** flags may be cleared on any unpinned instruction (a lost hint costs a
//!   register-file read, never a wrong value) and set on source slot `s` of instruction
//!   A only where the next instruction B reads the same register in the same slot with
//!   the same opcode, A runs unconditionally, does not yield and does not write that
//!   register, B waits on no scoreboard (no pending write can land between the two
//!   reads), and ptxas itself uses reuse flags on that opcode in this kernel.

use crate::decode::control::Control;
use crate::decode::instr::Instruction;
use crate::legality::analysis::Kernel;
use crate::legality::moves::{Action, Kind};
use crate::legality::order::{Order, Violation};
use std::collections::{HashMap, HashSet};

/// Whether sm_90 has an encoding for these stall, yield and reuse bits. nvdisasm
/// (CUDA 13.0) decodes the three as one table per instruction class, and probing every
/// value on every instruction class of our kernels (f32 and fp16 tensor-core) shows the
/// same hole in all of them: with the raw yield bit set, stall 0 and stalls 12–15 have
/// no encoding, and neither does any reuse flag with stall 0. ptxas never emits these.
pub fn encodable(c: &Control) -> bool {
    let stall_ok = !c.yield_bit || (1..=11).contains(&c.stall);
    stall_ok && (c.reuse == 0 || c.stall != 0)
}

/// What the original kernel shows about its control bits.
#[derive(Debug, Clone, Default)]
pub struct ControlRules {
    /// Smallest stall ptxas gave an instruction followed by another, by their base
    /// opcodes.
    pub pair_floor: HashMap<(String, String), u8>,
    /// Smallest stall ptxas gave each base opcode.
    pub opcode_floor: HashMap<String, u8>,
    /// Base opcodes that carry a reuse flag somewhere in the kernel.
    pub reuse_opcodes: HashSet<String>,
    /// The raw yield-bit value of a yielding instruction.
    pub yield_value: bool,
}

/// Slots the reuse flags cover (a, b, c, d).
const REUSE_SLOTS: usize = 4;
/// Largest stall count the field holds.
const MAX_STALL: u8 = 15;

impl ControlRules {
    /// Reads the rules off the original instructions (in original order).
    pub fn observe(instructions: &[Instruction]) -> ControlRules {
        let mut rules = ControlRules::default();
        for (i, ins) in instructions.iter().enumerate() {
            let stall = ins.control.stall;
            let e = rules.opcode_floor.entry(ins.base.clone()).or_insert(stall);
            *e = (*e).min(stall);
            if let Some(next) = instructions.get(i + 1) {
                let e = rules
                    .pair_floor
                    .entry((ins.base.clone(), next.base.clone()))
                    .or_insert(stall);
                *e = (*e).min(stall);
            }
        }
        // Reuse flags only ever appear on non-yielding instructions: their yield value
        // is the non-yielding one. Without any, the raw 0 yields (the encoding's usual
        // reading, `shared/DESIGN.md`).
        let flagged: Vec<&Instruction> = instructions
            .iter()
            .filter(|i| i.control.reuse != 0)
            .collect();
        rules.yield_value = match flagged.first() {
            Some(i) => !i.control.yield_bit,
            None => false,
        };
        rules.reuse_opcodes = flagged.iter().map(|i| i.base.clone()).collect();
        rules
    }

    pub fn yields(&self, c: &Control) -> bool {
        c.yield_bit == self.yield_value
    }
}

impl Kernel {
    /// The control bits written at `position`: the instruction's (edited) bits with
    /// every reuse flag dropped that is not valid there.
    pub fn effective_control(&self, order: &Order, position: usize) -> Control {
        let i = order.at(position);
        let mut c = self.control(order, i);
        if c.reuse == 0 {
            return c;
        }
        if self.rules.yields(&c) {
            c.reuse = 0;
            return c;
        }
        let n = self.len();
        let successor_kept =
            (position + 1 < n).then(|| order.at(position + 1)) == (i + 1 < n).then_some(i + 1);
        let original = self.instructions[i].control.reuse;
        for slot in 0..REUSE_SLOTS {
            let bit = 1u8 << slot;
            let kept =
                (successor_kept && original & bit != 0) || self.reusable(order, position, slot);
            if c.reuse & bit != 0 && !kept {
                c.reuse &= !bit;
            }
        }
        c
    }

    /// Whether the instruction at `position` may hand operand `slot` to the next one
    /// through the reuse cache (the module's rule).
    pub fn reusable(&self, order: &Order, position: usize, slot: usize) -> bool {
        if position + 1 >= self.len() {
            return false;
        }
        let (i, j) = (order.at(position), order.at(position + 1));
        let (a, b) = (&self.instructions[i], &self.instructions[j]);
        let Some(Some(register)) = a.slots.get(slot) else {
            return false;
        };
        self.block_of[i] == self.block_of[j]
            && !a.ends_block()
            && !a.guarded
            && a.opcode == b.opcode
            && self.rules.reuse_opcodes.contains(&a.base)
            && b.slots.get(slot) == Some(&Some(*register))
            && !a.defs.contains(register)
            && !self.rules.yields(&self.control(order, i))
            && self.control(order, j).wait_mask == 0
    }

    /// Reuse flags the instruction at `position` could newly set.
    fn settable_reuse(&self, order: &Order, position: usize) -> u8 {
        let current = self.effective_control(order, position).reuse;
        (0..REUSE_SLOTS)
            .filter(|&s| self.reusable(order, position, s))
            .fold(0u8, |m, s| m | 1 << s)
            & !current
    }

    /// The smallest stall an edit may give the instruction at `position`: what ptxas
    /// gave the same pair of opcodes (or the opcode) anywhere in the kernel.
    pub fn stall_floor(&self, order: &Order, position: usize) -> u8 {
        let a = &self.instructions[order.at(position)];
        (position + 1 < self.len())
            .then(|| {
                let b = &self.instructions[order.at(position + 1)];
                self.rules
                    .pair_floor
                    .get(&(a.base.clone(), b.base.clone()))
                    .copied()
            })
            .flatten()
            .or_else(|| self.rules.opcode_floor.get(&a.base).copied())
            .unwrap_or(a.control.stall)
    }

    /// Per position: how many stall cycles the instruction there could lose before a
    /// distance constraint spanning it breaks (`u32::MAX` where none spans it).
    pub fn stall_slack(&self, order: &Order) -> Vec<u32> {
        let mut slack = vec![u32::MAX; self.len()];
        let mut span = |from: usize, to: usize, spare: u32| {
            for s in &mut slack[from..to] {
                *s = (*s).min(spare);
            }
        };
        for d in &self.distances {
            let (p, c) = (order.position(d.producer), order.position(d.consumer));
            if p < c {
                let cycles = self.cycles(order, p, c, u32::MAX);
                span(p, c, cycles.saturating_sub(d.cycles));
            }
        }
        for e in &self.from_block_start {
            let start = self.blocks[self.block_of[e.instruction]].start;
            let p = order.position(e.instruction);
            let cycles = self.cycles(order, start, p, u32::MAX);
            span(start, p, cycles.saturating_sub(e.cycles));
        }
        for e in &self.to_block_end {
            let end = self.blocks[self.block_of[e.instruction]].end;
            let p = order.position(e.instruction);
            let cycles = self.cycles(order, p, end, u32::MAX);
            span(p, end, cycles.saturating_sub(e.cycles));
        }
        slack
    }

    /// Whether control edit `action` is legal in `order` (`slack` from `stall_slack`
    /// when the caller has it).
    pub(crate) fn control_legal(
        &self,
        order: &Order,
        action: Action,
        slack: Option<&[u32]>,
    ) -> bool {
        let p = action.row;
        let i = order.at(p);
        if !self.control_editable(i) {
            return false;
        }
        let c = self.control(order, i);
        let kind_allows = match action.kind {
            Kind::Up | Kind::Down => false,
            Kind::Yield => true,
            Kind::ReuseSet => self.settable_reuse(order, p) != 0,
            Kind::ReuseClear => self.effective_control(order, p).reuse != 0 || c.reuse != 0,
            Kind::StallUp => c.stall < MAX_STALL,
            Kind::StallDown => {
                c.stall > 0
                    && c.stall > self.stall_floor(order, p)
                    && match slack {
                        Some(s) => s[p] >= 1,
                        None => self.stall_slack(order)[p] >= 1,
                    }
            }
        };
        kind_allows && encodable(&self.edited_control(order, action))
    }

    /// The control bits instruction at `action.row` has after control edit `action`.
    fn edited_control(&self, order: &Order, action: Action) -> Control {
        let p = action.row;
        let mut c = self.control(order, order.at(p));
        match action.kind {
            Kind::Up | Kind::Down => {}
            Kind::Yield => {
                c.yield_bit = !c.yield_bit;
                if self.rules.yields(&c) {
                    c.reuse = 0;
                }
            }
            Kind::ReuseSet => c.reuse |= self.settable_reuse(order, p),
            Kind::ReuseClear => c.reuse = 0,
            Kind::StallUp => c.stall = (c.stall + 1).min(MAX_STALL),
            Kind::StallDown => c.stall = c.stall.saturating_sub(1),
        }
        c
    }

    /// Applies control edit `action` (legal by `control_legal`). Edits hold the raw
    /// bits: an original reuse flag dropped while its successor is elsewhere stays, and
    /// is written again if the successor comes back.
    pub(crate) fn apply_control(&self, order: &mut Order, action: Action) {
        let p = action.row;
        let i = order.at(p);
        if action.kind.is_swap() {
            return;
        }
        let original = self.instructions[i].control;
        let c = self.edited_control(order, action);
        order.set_control(i, c, original);
    }

    /// Whether instruction `i`'s control bits may be edited at all: not where it is
    /// pinned, and never on a `NOP` (padding and alignment that does no work; its
    /// encoding also admits fewer stall/yield combinations: nvdisasm refuses a
    /// yielding `NOP` with stall 0).
    fn control_editable(&self, i: usize) -> bool {
        self.pinned[i].is_none() && self.instructions[i].base != "NOP"
    }

    /// Re-checks every control edit of `order`.
    pub(crate) fn verify_controls(&self, order: &Order) -> Result<(), Violation> {
        for (i, c) in order.edits() {
            let original = self.instructions[i].control;
            if !self.control_editable(i) {
                return Err(Violation::NotEditable(i));
            }
            let mut same = c;
            same.stall = original.stall;
            same.yield_bit = original.yield_bit;
            same.reuse = original.reuse;
            if same != original {
                return Err(Violation::EditedField(i));
            }
            let p = order.position(i);
            let floor = self.stall_floor(order, p);
            if c.stall < original.stall && c.stall < floor {
                return Err(Violation::StallFloor {
                    index: i,
                    stall: c.stall,
                    floor,
                });
            }
            if self.rules.yields(&c) && c.reuse != 0 {
                return Err(Violation::YieldWithReuse(i));
            }
            if !encodable(&c) {
                return Err(Violation::Unencodable(i));
            }
            let added = c.reuse & !original.reuse;
            let invalid = (0..REUSE_SLOTS)
                .filter(|&s| added & (1 << s) != 0 && !self.reusable(order, p, s))
                .fold(0u8, |m, s| m | 1 << s);
            if invalid != 0 {
                return Err(Violation::Reuse {
                    index: i,
                    flags: invalid,
                });
            }
        }
        Ok(())
    }
}

impl Kernel {
    /// What `order` changed against the original, by kind: instructions moved, yield
    /// bits flipped, reuse flags gained and lost (as written), stall cycles removed
    /// and added.
    pub fn edit_counts(&self, order: &Order) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        let mut add = |k: &str, n: usize| {
            if n > 0 {
                *out.entry(k.to_string()).or_insert(0) += n;
            }
        };
        add("moved", order.moved().len());
        for (i, c) in order.edits() {
            let o = self.instructions[i].control;
            add("yield", usize::from(c.yield_bit != o.yield_bit));
            add("stall_down", usize::from(o.stall.saturating_sub(c.stall)));
            add("stall_up", usize::from(c.stall.saturating_sub(o.stall)));
        }
        for p in 0..self.len() {
            let now = self.effective_control(order, p).reuse;
            let before = self.instructions[order.at(p)].control.reuse;
            add("reuse_set", (now & !before).count_ones() as usize);
            add("reuse_clear", (before & !now).count_ones() as usize);
        }
        out
    }

    /// One line per edited instruction: offset now, the instruction, and its changed
    /// fields.
    pub fn describe_edits(&self, order: &Order) -> Vec<String> {
        let mut out = Vec::new();
        for p in 0..self.len() {
            let i = order.at(p);
            let (o, c) = (
                self.instructions[i].control,
                self.effective_control(order, p),
            );
            let mut parts = Vec::new();
            if c.stall != o.stall {
                parts.push(format!("stall {}→{}", o.stall, c.stall));
            }
            if c.yield_bit != o.yield_bit {
                let word = if self.rules.yields(&c) {
                    "yields"
                } else {
                    "no longer yields"
                };
                parts.push(word.to_string());
            }
            if c.reuse != o.reuse {
                parts.push(format!("reuse {:04b}→{:04b}", o.reuse, c.reuse));
            }
            if !parts.is_empty() {
                out.push(format!(
                    "/*{:04x}*/ {}  ({})",
                    p * 16,
                    self.instructions[i].text,
                    parts.join(", ")
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legality::testkit::{ctl, kernel, kernel_of};

    fn act(row: usize, kind: Kind) -> Action {
        Action { row, kind }
    }

    #[test]
    fn stall_down_keeps_fixed_latency_distances_and_the_observed_floor() {
        // IADD3 → LDG address needs 8 cycles (table); originally 1 + 9 = 10.
        let k = kernel(&[
            ("IADD3 R8, R8, 0x10, RZ", ctl(1, None, 0)),
            ("FFMA R20, R21, R22, R20", ctl(9, None, 0)),
            ("LDG.E R4, desc[UR4][R8.64]", ctl(1, Some(0), 0)),
            ("FFMA R24, R25, R26, R24", ctl(3, None, 0)),
            ("FFMA R28, R25, R26, R28", ctl(3, None, 0)),
            // A second IADD3 → LDG address pair 8 cycles apart (what ptxas needs), and
            // FFMA → LDG at stall 1 (that pair's floor).
            ("IADD3 R10, R10, 0x10, RZ", ctl(1, None, 0)),
            ("FFMA R30, R25, R26, R30", ctl(6, None, 0)),
            ("FFMA R31, R25, R26, R31", ctl(1, None, 0)),
            ("LDG.E R6, desc[UR4][R10.64]", ctl(1, Some(1), 0)),
            ("EXIT", ctl(5, None, 0)),
        ]);
        let mut order = Order::identity(k.len());
        // Two cycles of slack on the FFMA between the IADD3 and the load.
        for _ in 0..2 {
            assert!(k.legal(&order, act(1, Kind::StallDown)));
            k.apply(&mut order, act(1, Kind::StallDown));
        }
        assert!(!k.legal(&order, act(1, Kind::StallDown)), "8 cycles needed");
        assert_eq!(k.verify(&order), Ok(()));
        // FFMA → FFMA never went below 3 in this kernel: the floor.
        assert!(!k.legal(&Order::identity(k.len()), act(3, Kind::StallDown)));
        // Stall up is legal up to the encodable limit; pinned instructions are never
        // edited.
        assert!(k.legal(&order, act(3, Kind::StallUp)));
        assert!(!k.legal(&order, act(9, Kind::StallUp)));
        assert!(!k.legal(&order, act(9, Kind::Yield)));
    }

    #[test]
    fn hand_made_illegal_edits_are_rejected_by_the_verifier() {
        let k = kernel(&[
            ("IADD3 R8, R8, 0x10, RZ", ctl(1, None, 0)),
            ("FFMA R20, R21, R22, R20", ctl(9, None, 0)),
            ("LDG.E R4, desc[UR4][R8.64]", ctl(1, Some(0), 0)),
            ("FFMA R24, R25, R26, R24", ctl(3, None, 0)),
            ("FFMA R28, R25, R27, R28", ctl(3, None, 0)),
            ("EXIT", ctl(5, None, 0)),
        ]);
        let edited = |i: usize, f: &dyn Fn(&mut Control)| {
            let mut order = Order::identity(k.len());
            let o = k.instructions[i].control;
            let mut c = o;
            f(&mut c);
            order.set_control(i, c, o);
            k.verify(&order)
        };
        // Stall: below a distance, below the floor.
        assert!(matches!(
            edited(1, &|c| c.stall = 2),
            Err(Violation::Distance { .. })
        ));
        assert!(matches!(
            edited(3, &|c| c.stall = 1),
            Err(Violation::StallFloor { .. })
        ));
        // Reuse: slot b differs (R26 vs R27); slot a is fine.
        assert!(matches!(
            edited(3, &|c| c.reuse = 0b0010),
            Err(Violation::Reuse { flags: 0b0010, .. })
        ));
        // Slot a would do, but ptxas flags no FFMA in this kernel: not reuse-capable.
        assert!(matches!(
            edited(3, &|c| c.reuse = 0b0001),
            Err(Violation::Reuse { flags: 0b0001, .. })
        ));
        let flagged = kernel_of(&[
            ("FFMA R24, R25, R26, R24", 3, 0b0001),
            ("FFMA R28, R25, R27, R28", 3, 0),
            ("FFMA R30, R25, R27, R30", 3, 0),
            ("EXIT", 5, 0),
        ]);
        let mut order = Order::identity(flagged.len());
        let o = flagged.instructions[1].control;
        let mut c = o;
        c.reuse = 0b0011;
        order.set_control(1, c, o);
        assert_eq!(flagged.verify(&order), Ok(()));
        let mut order = Order::identity(flagged.len());
        let o = flagged.instructions[0].control;
        let mut c = o;
        c.yield_bit = !c.yield_bit;
        order.set_control(0, c, o);
        assert_eq!(flagged.verify(&order), Err(Violation::YieldWithReuse(0)));
        // Fields other than stall, yield and reuse, and pinned instructions.
        assert_eq!(
            edited(3, &|c| c.wait_mask = 1),
            Err(Violation::EditedField(3))
        );
        assert_eq!(edited(5, &|c| c.stall = 6), Err(Violation::NotEditable(5)));
        // Encodings sm_90 lacks: a non-yielding (raw bit set) stall of 12, even where
        // the distance allows it; and StallUp stops at 11 there.
        assert_eq!(edited(3, &|c| c.stall = 12), Err(Violation::Unencodable(3)));
        let mut at_eleven = Order::identity(k.len());
        let o = k.instructions[3].control;
        let mut c = o;
        c.stall = 11;
        at_eleven.set_control(3, c, o);
        assert_eq!(k.verify(&at_eleven), Ok(()));
        assert!(!k.legal(&at_eleven, act(3, Kind::StallUp)));
        // NOPs: never edited (nvdisasm refuses a yielding NOP with stall 0).
        let nop = kernel_of(&[
            ("FFMA R24, R25, R26, R24", 3, 0),
            ("EXIT", 5, 0),
            ("NOP", 0, 0),
        ]);
        let identity = Order::identity(nop.len());
        for kind in Kind::ALL.into_iter().filter(|k| !k.is_swap()) {
            assert!(!nop.legal(&identity, Action { row: 2, kind }), "{kind:?}");
        }
        let mut order = identity.clone();
        let o = nop.instructions[2].control;
        let mut c = o;
        c.yield_bit = !c.yield_bit;
        order.set_control(2, c, o);
        assert_eq!(nop.verify(&order), Err(Violation::NotEditable(2)));
    }

    /// A predicate read as a guard keeps ptxas's 13 cycles even where the kernel reads
    /// predicates as operands sooner (found on a `wgmma` kernel's epilogue, where 12
    /// gave wrong results on an H100).
    #[test]
    fn a_guard_predicate_keeps_its_distance() {
        let k = kernel_of(&[
            ("ISETP.GT.AND P6, PT, R7, 0x37ff, PT", 13, 0),
            ("@P6 LOP3.LUT R16, R16, 0x1, RZ, 0xfc, !PT", 4, 0),
            ("ISETP.GT.AND P5, PT, R7, 0x37f7, PT", 5, 0),
            ("SEL R3, R4, R5, P5", 4, 0),
            ("EXIT", 5, 0),
        ]);
        let edited = |i: usize, stall: u8| {
            let mut order = Order::identity(k.len());
            let o = k.instructions[i].control;
            let mut c = o;
            c.stall = stall;
            order.set_control(i, c, o);
            k.verify(&order)
        };
        // The operand read pools at the table's 5; the guard read does not.
        assert!(matches!(edited(0, 12), Err(Violation::Distance { .. })));
        assert_eq!(edited(2, 5), Ok(()));
        assert_eq!(
            k.instructions[1].guard,
            Some(crate::decode::instr::PRED_BASE + 6)
        );
    }

    #[test]
    fn yield_clears_reuse_and_reuse_set_needs_the_same_register_and_no_wait() {
        let k = kernel_of(&[
            ("FFMA R20, R21, R22, R20", 4, 0b0011),
            ("FFMA R24, R21, R22, R24", 4, 0),
            ("FFMA R26, R21, R22, R26", 4, 0),
            ("FFMA R21, R21, R23, R21", 4, 0),
            ("FFMA R27, R21, R24, R27", 4, 0),
            ("EXIT", 5, 0),
        ]);
        let mut order = Order::identity(k.len());
        // FFMA 1 → 2 share R21 and R22: both flags settable.
        assert!(k.legal(&order, act(1, Kind::ReuseSet)));
        k.apply(&mut order, act(1, Kind::ReuseSet));
        assert_eq!(k.effective_control(&order, 1).reuse, 0b0011);
        // FFMA 3 writes R21: its successor may not reuse it.
        assert!(!k.legal(&order, act(3, Kind::ReuseSet)));
        // Yielding drops the flags.
        k.apply(&mut order, act(0, Kind::Yield));
        assert_eq!(k.effective_control(&order, 0).reuse, 0);
        assert!(
            !k.legal(&order, act(0, Kind::ReuseSet)),
            "a yielding instruction"
        );
        assert_eq!(k.verify(&order), Ok(()));
        let counts = k.edit_counts(&order);
        assert_eq!(counts.get("yield"), Some(&1));
        assert_eq!(counts.get("reuse_set"), Some(&2));
        assert_eq!(counts.get("reuse_clear"), Some(&2));
        // A waiting successor may not take a reused operand.
        let mut waits = ctl(4, None, 0b1);
        waits.reuse = 0;
        let mut flagged = ctl(4, None, 0);
        flagged.reuse = 0b1;
        let w = kernel(&[
            ("LDS R30, [R2]", ctl(1, Some(0), 0)),
            ("FFMA R20, R21, R22, R20", flagged),
            ("FFMA R24, R21, R22, R30", waits),
            ("EXIT", ctl(5, None, 0)),
        ]);
        assert!(!w.legal(&Order::identity(w.len()), act(1, Kind::ReuseSet)));
    }

    #[test]
    fn untracked_hmma_results_keep_their_distance() {
        // HMMA has no scoreboard: its consumer 6 + 6 cycles later keeps them.
        let k = kernel(&[
            ("HMMA.16816.F32 R4, R8, R12, R4", ctl(6, None, 0)),
            ("HMMA.16816.F32 R16, R8, R14, R16", ctl(6, None, 0)),
            ("FADD R30, R4, R5", ctl(4, None, 0)),
            ("EXIT", ctl(5, None, 0)),
        ]);
        let order = Order::identity(k.len());
        assert!(!k.legal(&order, act(0, Kind::StallDown)));
        assert!(!k.legal(&order, act(1, Kind::StallDown)));
    }
}
