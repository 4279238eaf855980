//! How many cycles a fixed-latency result needs before a consumer may issue.
//!
//! ptxas knows the exact latencies and encodes its schedule in stall counts, so the
//! smallest distance it left between a producer opcode and a consumer of the same kind
//! in this kernel is a proven sufficient distance. A built-in table of sm_90 leads
//! (shared/REFERENCE.md: integer ALU → ALU 6, → memory address 8, FP → FP 4,
//! IMAD → IMAD 6, predicate → FP 5, predicate → branch or memory 13) raises that
//! bound where the kernel offers few samples. A predicate read as an instruction's
//! guard is a class of its own, led like a branch's (13): a `wgmma` kernel's
//! epilogue had `ISETP` → `@P6 LOP3` at ptxas's 13 cycles, and 12 gave wrong results
//! on an H100, while predicates read as operands were pooled at 5. A pair never needs more than it had
//! originally (ptxas's own schedule is legal), and a producer neither observed nor in
//! the table keeps its original distance to each consumer.

use crate::decode::instr::{Instruction, PRED_BASE, Reg, UPRED_BASE, UREG_BASE};

/// Longest fixed latency on sm_90 that stall counts must cover (predicate → branch).
pub const LONGEST_FIXED: u32 = 13;

/// What the consumer does with the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Consumer {
    /// Address or data of a memory instruction, or its guard.
    Memory,
    /// A branch or other control flow.
    Control,
    /// The predicate guarding an instruction (`@P0 …`).
    Guard,
    Other,
}

/// The class of a producer → consumer pair whose observed distances are pooled.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The producer's opcode without modifiers.
    pub producer: String,
    pub consumer: Consumer,
    /// The value is a predicate (or uniform predicate).
    pub predicate: bool,
}

impl Key {
    /// A register's producer → consumer pair (keyed by the producer's full opcode:
    /// variants such as `IMAD.WIDE` and `IMAD.MOV` may differ in latency).
    pub fn of(producer: &Instruction, consumer: &Instruction, register: Reg) -> Key {
        let kind = if consumer.ends_block() {
            Consumer::Control
        } else if consumer.guard == Some(register) {
            Consumer::Guard
        } else if consumer.accesses_memory() || consumer.variable_latency() {
            Consumer::Memory
        } else {
            Consumer::Other
        };
        let predicate = (PRED_BASE..UREG_BASE).contains(&register) || register >= UPRED_BASE;
        Key {
            producer: producer.opcode.clone(),
            consumer: kind,
            predicate,
        }
    }

    /// A pair that only distance orders: a scoreboard set → its first wait (the
    /// scoreboard must be counting before the waiter looks), or a variable-latency
    /// reader without a read scoreboard → the next writer of a register it reads.
    pub fn special(instruction: &Instruction, what: &str) -> Key {
        Key {
            producer: format!("{}:{what}", instruction.opcode),
            consumer: Consumer::Other,
            predicate: false,
        }
    }
}

/// The table's lead for a pair, when the producer is a known fixed-latency opcode.
pub fn table(key: &Key) -> Option<u32> {
    const FP: &[&str] = &[
        "FFMA", "FADD", "FMUL", "FMNMX", "FSEL", "FSETP", "HFMA2", "HADD2",
    ];
    const INT: &[&str] = &[
        "IADD3", "IMAD", "LOP3", "SHF", "LEA", "ISETP", "MOV", "SEL", "IMNMX", "PRMT", "IABS",
        "PLOP3", "SGXT", "BMSK", "UIADD3", "UMOV", "ULEA", "ULOP3", "USHF", "UIMAD", "USEL",
        "UISETP", "UPRMT", "R2P", "P2R", "IDP", "VIADD", "VIMNMX", "CS2R",
    ];
    if key.producer.contains(':') {
        return None;
    }
    let p = key.producer.split('.').next().unwrap_or("");
    if !FP.contains(&p) && !INT.contains(&p) {
        return None;
    }
    Some(match (key.predicate, key.consumer) {
        (true, Consumer::Memory | Consumer::Control | Consumer::Guard) => 13,
        (true, Consumer::Other) => 5,
        (false, Consumer::Memory | Consumer::Control | Consumer::Guard) => 8,
        (false, Consumer::Other) if FP.contains(&p) => 4,
        (false, Consumer::Other) => 6,
    })
}

/// Cycles a pair with this key, originally `original` apart, must keep.
pub fn required(key: &Key, observed: Option<u32>, original: u32) -> u32 {
    match (table(key), observed) {
        (None, None) => original,
        (t, o) => t.unwrap_or(0).max(o.unwrap_or(0)).min(original),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(producer: &str, consumer: Consumer, predicate: bool) -> Key {
        Key {
            producer: producer.into(),
            consumer,
            predicate,
        }
    }

    #[test]
    fn never_more_than_the_original_and_unknown_keeps_it() {
        let k = key("IMAD", Consumer::Memory, false);
        assert_eq!(required(&k, Some(5), 20), 8);
        assert_eq!(required(&k, Some(10), 20), 10);
        assert_eq!(required(&k, Some(5), 6), 6);
        let odd = key("XYZZY", Consumer::Other, false);
        assert_eq!(required(&odd, None, 11), 11);
        assert_eq!(required(&odd, Some(3), 11), 3);
        assert_eq!(
            table(&key("ISETP.GE.AND", Consumer::Control, true)),
            Some(13)
        );
        assert_eq!(table(&key("STS:sb", Consumer::Other, false)), None);
        assert_eq!(table(&key("ISETP.GT.AND", Consumer::Guard, true)), Some(13));
    }
}
