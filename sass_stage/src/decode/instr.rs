//! One SASS instruction as the dependency analysis sees it: opcode and modifiers, guard
//! predicate, the registers it writes and reads (vector widths expanded to pairs and
//! quads, uniform registers and predicates included), the memory spaces it touches,
//! and its control bits.
//!
//! Operand roles are read conservatively: the leading register or predicate operands
//! are the definitions, and every other register operand is a use. Where SASS syntax
//! leaves a role unclear (a predicate after the first destination), the operand counts
//! as both, which can only forbid more moves, never allow a wrong one.

use crate::decode::control::Control;
use crate::decode::disasm::Line;

/// A register-like resource, as one id: `R0–R255` are 0–255, `P0–P6` 256–262,
/// `UR0–UR63` 264–327, `UP0–UP6` 328–334. `RZ`, `PT`, `URZ`, `UPT` are constants and
/// never appear.
pub type Reg = u16;

pub const PRED_BASE: Reg = 256;
pub const UREG_BASE: Reg = 264;
pub const UPRED_BASE: Reg = 328;
/// Number of distinct register ids.
pub const REG_IDS: usize = 336;

/// A memory space an instruction reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Space {
    Global,
    Shared,
    Local,
    /// Generic addressing (`LD`, `ST`, `ATOM`): may be any of the above.
    Generic,
}

impl Space {
    /// Whether an access to `self` may alias one to `other`.
    pub fn may_alias(self, other: Space) -> bool {
        self == other || self == Space::Generic || other == Space::Generic
    }
}

/// One decoded instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// Byte offset in the original text.
    pub offset: usize,
    pub text: String,
    /// Opcode with its modifiers, e.g. `LDG.E.128.CONSTANT`.
    pub opcode: String,
    /// The opcode without modifiers, e.g. `LDG`.
    pub base: String,
    pub control: Control,
    pub low: u64,
    pub high: u64,
    pub defs: Vec<Reg>,
    pub uses: Vec<Reg>,
    pub reads: Option<Space>,
    pub writes: Option<Space>,
    /// Guarded by a predicate (`@P0`, `@!P1`); `@!PT` (never executes) counts too.
    pub guarded: bool,
    /// The guard's predicate register (None for none, and for `@PT`/`@!PT`).
    pub guard: Option<Reg>,
    /// Source operand slots in order (the operand-reuse flags' slots a, b, c, …): the
    /// general register a plain register operand names, `None` for anything else
    /// (immediates, constants, addresses, predicates, negated or absolute operands, RZ).
    pub slots: Vec<Option<Reg>>,
    /// Label this instruction branches to, if any.
    pub target: Option<String>,
    /// Labels naming this instruction.
    pub labels: Vec<String>,
}

/// Opcodes that are never moved nor swapped with (shared/REFERENCE.md, "Pinned").
const PINNED: &[&str] = &[
    "BRA",
    "BRX",
    "JMP",
    "JMX",
    "CALL",
    "RET",
    "EXIT",
    "BSSY",
    "BSYNC",
    "BREAK",
    "WARPSYNC",
    "YIELD",
    "NANOSLEEP",
    "BPT",
    "ELECT",
    "BAR",
    "MEMBAR",
    "FENCE",
    "ERRBAR",
    "CCTL",
    "DEPBAR",
    "LDGDEPBAR",
    "SYNCS",
    "ARRIVES",
    "UCGABAR_ARV",
    "UCGABAR_WAIT",
    "WARPGROUP",
    "HGMMA",
    "IGMMA",
    "QGMMA",
    "UTMALDG",
    "UTMASTG",
    "UTMAPF",
    "UTMACCTL",
    "UBLKCP",
    "UBLKRED",
    "UBLKPF",
    "SHFL",
    "VOTE",
    "VOTEU",
    "MATCH",
    "REDUX",
    "LEPC",
    "KILL",
    "RTT",
    "ACQBULK",
    "ENDCOLLECTIVE",
];

/// Results that come back through a scoreboard even when ptxas attached none.
const VARIABLE_LATENCY: &[&str] = &[
    "LDG", "LDS", "LDL", "LD", "LDSM", "LDC", "ULDC", "LDGSTS", "ATOM", "ATOMG", "ATOMS", "RED",
    "REDG", "S2R", "S2UR", "MUFU", "POPC", "FLO", "BREV", "I2F", "F2I", "F2F", "I2I", "FRND",
    "DADD", "DMUL", "DFMA", "DSETP", "R2UR", "SHFL", "MATCH", "REDUX", "VOTE", "HMMA", "IMMA",
    "QSPC", "CCTL", "TEX", "TLD", "SUST", "SULD", "SUATOM",
];

/// Memory instructions the agents may move (CuAsmRL's action set, plus local and
/// generic accesses).
const MOVABLE: &[&str] = &[
    "LDG", "STG", "LDS", "STS", "LDSM", "STSM", "LDGSTS", "LDL", "STL", "LD", "ST",
];

/// Opcodes whose first operand is not a destination.
const NO_DEST: &[&str] = &[
    "STG", "STS", "STL", "ST", "STSM", "RED", "REDG", "LDGSTS", "BRA", "BRX", "JMP", "CALL",
    "EXIT", "RET", "BAR", "BSSY", "BSYNC", "WARPSYNC", "NOP", "DEPBAR", "MEMBAR", "CCTL",
];

impl Instruction {
    /// Decodes a disassembled line.
    pub fn parse(line: &Line) -> Instruction {
        let mut text = line.text.as_str();
        let mut guard = None;
        if let Some(rest) = text.strip_prefix('@') {
            let (g, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            guard = Some(g.trim_start_matches('!').to_string());
            text = rest.trim();
        }
        let (opcode, operand_text) = text.split_once(' ').unwrap_or((text, ""));
        let base = opcode.split('.').next().unwrap_or(opcode).to_string();
        let operands = split_operands(operand_text);
        let modifiers: Vec<&str> = opcode.split('.').skip(1).collect();
        let width = vector_width(&base, &modifiers);

        let mut defs = Vec::new();
        let mut uses = Vec::new();
        let guard_register = guard
            .as_ref()
            .and_then(|g| registers(g, 1).first().copied());
        uses.extend(guard_register);
        let mut defining = !NO_DEST.contains(&base.as_str());
        let mut slots = Vec::new();
        for (i, operand) in operands.iter().enumerate() {
            let is_address = operand.contains('[');
            let regs = if is_address {
                address_registers(operand)
            } else {
                registers(operand, width)
            };
            let predicate = is_predicate(operand);
            // The first operand and the predicates right after it are written.
            if defining && !is_address && (i == 0 || predicate) {
                defs.extend(&regs);
                if i > 0 {
                    uses.extend(&regs);
                }
                continue;
            }
            defining = false;
            slots.push(plain_register(operand));
            uses.extend(regs);
        }
        // Predicated execution keeps the old value when the guard is false.
        if guard.is_some() {
            uses.extend(defs.iter().copied());
        }
        let (reads, writes) = memory(&base, &modifiers);
        defs.sort_unstable();
        defs.dedup();
        uses.sort_unstable();
        uses.dedup();
        let target = operand_text.find("`(").and_then(|start| {
            let rest = &operand_text[start + 2..];
            rest.find(')').map(|end| rest[..end].to_string())
        });
        Instruction {
            offset: line.offset,
            text: line.text.clone(),
            opcode: opcode.to_string(),
            base,
            control: Control::decode(line.high),
            low: line.low,
            high: line.high,
            defs,
            uses,
            reads,
            writes,
            guarded: guard.is_some(),
            guard: guard_register,
            slots,
            target,
            labels: line.labels.clone(),
        }
    }

    /// Never moved and never swapped with, by its opcode or operands.
    pub fn pinned_by_opcode(&self) -> bool {
        let reads_cta_id = matches!(self.base.as_str(), "S2R" | "S2UR" | "CS2R")
            && [
                "SR_CTAID",
                "SR_CgaCtaId",
                "SR_CLUSTER",
                "SR_CLOCK",
                "SR_GLOBALTIMER",
            ]
            .iter()
            .any(|s| self.text.contains(s));
        // `@!PT LDS RZ, [RZ]`: a dummy ptxas places before LDGSTS sequences.
        let dummy = self.text.starts_with("@!PT");
        PINNED.contains(&self.base.as_str()) || reads_cta_id || dummy
    }

    /// A memory instruction the agents may move.
    pub fn movable(&self) -> bool {
        MOVABLE.contains(&self.base.as_str())
    }

    /// Results arrive through a scoreboard rather than after a fixed number of cycles.
    pub fn variable_latency(&self) -> bool {
        self.control.write_barrier.is_some() || VARIABLE_LATENCY.contains(&self.base.as_str())
    }

    /// Touches memory other than the read-only constant banks.
    pub fn accesses_memory(&self) -> bool {
        self.reads.is_some() || self.writes.is_some()
    }

    /// Ends a basic block: control may leave after it.
    pub fn ends_block(&self) -> bool {
        matches!(
            self.base.as_str(),
            "BRA" | "BRX" | "JMP" | "JMX" | "CALL" | "RET" | "EXIT" | "BREAK" | "BPT" | "KILL"
        )
    }

    /// Control never falls through to the next instruction.
    pub fn unconditional_jump(&self) -> bool {
        !self.guarded && matches!(self.base.as_str(), "BRA" | "JMP" | "RET" | "EXIT" | "KILL")
    }
}

/// Splits operands at top-level commas.
fn split_operands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '[' | '(' | '{' => depth += 1,
            ']' | ')' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(current.trim().to_string());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out
}

/// Registers per vector operand: 4 for `.128` (and 4-matrix loads, MMA fragments),
/// 2 for `.64`, `.WIDE`, 64-bit `CS2R` and double precision, else 1.
fn vector_width(base: &str, modifiers: &[&str]) -> u16 {
    let has = |m: &str| modifiers.contains(&m);
    if has("128") || (base == "LDSM" && has("4")) || base.ends_with("MMA") {
        4
    } else if has("64")
        || has("WIDE")
        || has("F64")
        || (base == "CS2R" && !has("32"))
        || matches!(base, "DADD" | "DMUL" | "DFMA")
        || (base == "LDSM" && has("2"))
    {
        2
    } else {
        1
    }
}

fn is_predicate(operand: &str) -> bool {
    let o = operand.trim_start_matches(['!', '-', '|', '~']);
    o == "PR" || o == "UPR" || o.starts_with('P') || o.starts_with("UP")
}

/// The registers named by a non-address operand, `width` consecutive from its base.
fn registers(operand: &str, width: u16) -> Vec<Reg> {
    let o = operand.trim_start_matches(['!', '-', '|', '~']);
    let o = o.trim_end_matches('|');
    match o.split('.').next().unwrap_or(o) {
        "PR" => return (0..7).map(|i| PRED_BASE + i).collect(),
        "UPR" => return (0..7).map(|i| UPRED_BASE + i).collect(),
        _ => {}
    }
    match parse_register(o) {
        Some((base, limit)) => (0..width)
            .map(|i| base + i)
            .filter(|&r| r < limit)
            .collect(),
        None => Vec::new(),
    }
}

/// The general register of a plain register operand (`R12`, `R12.reuse`), if it is one.
fn plain_register(operand: &str) -> Option<Reg> {
    let name = operand.split('.').next()?;
    let number = name.strip_prefix('R')?;
    number.parse::<Reg>().ok().filter(|&r| r < PRED_BASE)
}

/// `R12`, `R12.reuse`, `UR4`, `P3`, `UP1` → (id, one past the last id of its file).
fn parse_register(token: &str) -> Option<(Reg, Reg)> {
    let name = token.split('.').next()?;
    let (kind, number) = if let Some(n) = name.strip_prefix("UR") {
        (UREG_BASE, (n, UPRED_BASE))
    } else if let Some(n) = name.strip_prefix("UP") {
        (UPRED_BASE, (n, UPRED_BASE + 7))
    } else if let Some(n) = name.strip_prefix('R') {
        (0, (n, PRED_BASE))
    } else if let Some(n) = name.strip_prefix('P') {
        (PRED_BASE, (n, PRED_BASE + 7))
    } else {
        return None;
    };
    let (digits, limit) = number;
    // RZ, PT, URZ, UPT and special registers (SR_*) are not tracked.
    let n: Reg = digits.parse().ok()?;
    Some((kind + n, limit))
}

/// Registers inside the brackets of an address: `desc[UR6][R2.64+0x10]` → UR6, UR7
/// (a 64-bit descriptor), R2, R3.
fn address_registers(operand: &str) -> Vec<Reg> {
    let mut out = Vec::new();
    let descriptor = operand.trim_start_matches(['-', '!']).starts_with("desc[");
    for (i, inner) in operand.split('[').skip(1).enumerate() {
        let inner = inner.split(']').next().unwrap_or("");
        for term in inner.split(['+', '-', '*']) {
            let term = term.trim();
            let width = if term.ends_with(".64") || (descriptor && i == 0) {
                2
            } else {
                1
            };
            out.extend(registers(term, width));
        }
    }
    out
}

/// The memory spaces read and written, from the opcode.
fn memory(base: &str, modifiers: &[&str]) -> (Option<Space>, Option<Space>) {
    use Space::*;
    match base {
        "LDG" => (Some(Global), None),
        "STG" => (None, Some(Global)),
        "LDS" | "LDSM" => (Some(Shared), None),
        "STS" | "STSM" => (None, Some(Shared)),
        "LDL" => (Some(Local), None),
        "STL" => (None, Some(Local)),
        "LD" => (Some(Generic), None),
        "ST" => (None, Some(Generic)),
        "LDGSTS" => (Some(Global), Some(Shared)),
        "ATOMG" | "REDG" => (Some(Global), Some(Global)),
        "ATOMS" => (Some(Shared), Some(Shared)),
        "ATOM" | "RED" => {
            // `RED.E.ADD...` with a descriptor is a global reduction on sm_90.
            let space = if modifiers.contains(&"E") {
                Global
            } else {
                Generic
            };
            (Some(space), Some(space))
        }
        _ => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Instruction {
        Instruction::parse(&Line {
            offset: 0,
            text: text.to_string(),
            low: 0,
            high: 0x000fe20000000800,
            labels: vec![],
        })
    }

    fn r(n: Reg) -> Reg {
        n
    }

    #[test]
    fn loads_and_stores_expand_vector_registers() {
        let i = parse("LDG.E.128.CONSTANT R4, desc[UR6][R2.64+0x10]");
        assert_eq!(i.defs, vec![4, 5, 6, 7]);
        assert_eq!(i.uses, vec![r(2), 3, UREG_BASE + 6, UREG_BASE + 7]);
        assert_eq!(i.reads, Some(Space::Global));
        assert!(i.movable() && i.variable_latency() && !i.pinned_by_opcode());

        let i = parse("STS.64 [R9+0x100], R12");
        assert!(i.defs.is_empty());
        assert_eq!(i.uses, vec![9, 12, 13]);
        assert_eq!(i.writes, Some(Space::Shared));
    }

    #[test]
    fn predicates_guards_and_carries() {
        let i = parse("ISETP.GE.AND P0, PT, R3, 0x1, PT");
        assert_eq!(i.defs, vec![PRED_BASE]);
        assert_eq!(i.uses, vec![3]);
        let i = parse("@!P1 IADD3.X R5, PT, PT, R3, UR5, RZ, P0, !PT");
        assert_eq!(i.defs, vec![5]);
        assert!(i.uses.contains(&(PRED_BASE + 1)) && i.uses.contains(&PRED_BASE));
        assert!(i.uses.contains(&5), "a guarded write reads the old value");
        let i = parse("IMAD.WIDE R2, R63.reuse, 0x4, R4");
        assert_eq!(i.defs, vec![2, 3]);
        assert!(i.uses.contains(&63) && i.uses.contains(&4) && i.uses.contains(&5));
        assert_eq!(i.slots, vec![Some(63), None, Some(4)]);
        let i = parse("HMMA.16816.F32 R132, R164.reuse, R8, R132");
        assert_eq!(i.slots, vec![Some(164), Some(8), Some(132)]);
        let i = parse("ISETP.GE.AND P0, PT, R3, -R4, PT");
        assert_eq!(i.slots, vec![Some(3), None, None]);
        let i = parse("P2R R3, PR, RZ, 0x7f");
        assert_eq!(i.uses.len(), 7);
        let i = parse("ULDC.64 UR6, c[0x0][0x208]");
        assert_eq!(i.defs, vec![UREG_BASE + 6, UREG_BASE + 7]);
    }

    #[test]
    fn pinned_instructions_and_branches() {
        assert!(parse("BAR.SYNC.DEFER_BLOCKING 0x0").pinned_by_opcode());
        assert!(parse("S2R R0, SR_CTAID.X").pinned_by_opcode());
        assert!(!parse("S2R R0, SR_TID.X").pinned_by_opcode());
        assert!(parse("@!PT LDS RZ, [RZ]").pinned_by_opcode());
        let b = parse("@P0 BRA `(.L_x_3)");
        assert_eq!(b.target.as_deref(), Some(".L_x_3"));
        assert!(b.ends_block() && !b.unconditional_jump());
        assert!(parse("EXIT").unconditional_jump());
    }
}
