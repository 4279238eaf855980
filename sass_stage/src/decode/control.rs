//! Control bits of a Volta-and-later (here sm_90) instruction word.
//!
//! Every 128-bit SASS instruction carries its own scheduling information in its top
//! bits, set by ptxas: how many cycles to stall before issuing the next instruction,
//! a yield hint, the scoreboard (barrier) the instruction sets when its variable-latency
//! result is written or its source registers are read, the scoreboards it waits on, and
//! operand-reuse cache flags. The second stage reads them to know which instructions
//! depend on which scoreboard and how far apart fixed-latency pairs must stay, and
//! rewrites only the reuse flags. Layout (bits of the little-endian 128-bit word, as in
//! `shared/DESIGN.md`, "Stage 2", and `shared/REFERENCE.md`): stall 105–108, yield 109,
//! write barrier 110–112, read barrier 113–115 (7 = none), wait mask 116–121,
//! reuse 122–125. In the high 64-bit word these are bits 41–61.

/// First bit of the control field within the high 64-bit word (bit 105 of the word).
const SHIFT: u32 = 105 - 64;
/// Barrier index meaning "no barrier".
const NO_BARRIER: u8 = 7;
/// Mask of all control bits within the high 64-bit word (bits 41–61).
pub const CONTROL_MASK: u64 = ((1u64 << 21) - 1) << SHIFT;

/// Decoded control bits of one instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Control {
    /// Stall cycles before the next instruction may issue (0–15).
    pub stall: u8,
    /// The raw yield bit (bit 109). DESIGN.md reads 0 as "yield"; the issue's example
    /// word `0x000fe20000000800`, which it calls "yield", has this bit set. We keep the
    /// raw bit and leave its meaning to the scheduler model.
    pub yield_bit: bool,
    /// Scoreboard set when the result is written (variable-latency producers), 0–5.
    pub write_barrier: Option<u8>,
    /// Scoreboard set when the source operands have been read, 0–5.
    pub read_barrier: Option<u8>,
    /// Scoreboards this instruction waits on before issuing (bit i = scoreboard i).
    pub wait_mask: u8,
    /// Operand reuse-cache flags (bit i = operand slot i).
    pub reuse: u8,
}

impl Control {
    /// Decodes the control bits from the high 64-bit word of an instruction.
    pub fn decode(high: u64) -> Control {
        let bits = high >> SHIFT;
        let field = |shift: u32, width: u32| ((bits >> shift) & ((1 << width) - 1)) as u8;
        let barrier = |v: u8| (v != NO_BARRIER).then_some(v);
        Control {
            stall: field(0, 4),
            yield_bit: field(4, 1) == 1,
            write_barrier: barrier(field(5, 3)),
            read_barrier: barrier(field(8, 3)),
            wait_mask: field(11, 6),
            reuse: field(17, 4),
        }
    }

    /// The control field as it sits in the high word (other bits zero).
    ///
    /// Out-of-range fields are truncated to their width; a barrier of 7 or more
    /// encodes as "none" only when given as `None`.
    pub fn bits(&self) -> u64 {
        let barrier = |b: Option<u8>| u64::from(b.unwrap_or(NO_BARRIER) & 7);
        let bits = u64::from(self.stall & 0xf)
            | u64::from(self.yield_bit) << 4
            | barrier(self.write_barrier) << 5
            | barrier(self.read_barrier) << 8
            | u64::from(self.wait_mask & 0x3f) << 11
            | u64::from(self.reuse & 0xf) << 17;
        bits << SHIFT
    }

    /// Replaces the control bits of `high` with these, keeping every other bit.
    pub fn encode(&self, high: u64) -> u64 {
        (high & !CONTROL_MASK) | self.bits()
    }

    /// Whether this instruction waits on scoreboard `barrier` (0–5).
    pub fn waits_on(&self, barrier: u8) -> bool {
        barrier < 6 && self.wait_mask & (1 << barrier) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_word_from_the_issue() {
        let c = Control::decode(0x000fe20000000800);
        assert_eq!(c.stall, 1);
        assert!(c.yield_bit);
        assert_eq!(c.write_barrier, None);
        assert_eq!(c.read_barrier, None);
        assert_eq!(c.wait_mask, 0);
        assert_eq!(c.reuse, 0);
        assert_eq!(c.encode(0x0000_0000_0000_0800), 0x000fe20000000800);
    }

    #[test]
    fn known_words_with_barriers() {
        // `LDC R1, c[0x0][0x28]` at the start of an NVRTC sm_90 kernel: sets write
        // scoreboard 0, stall 1.
        let c = Control::decode(0x000e220000000800);
        assert_eq!(c.stall, 1);
        assert_eq!(c.write_barrier, Some(0));
        assert_eq!(c.read_barrier, None);
        assert_eq!(c.wait_mask, 0);
        // `IADD3 R1, R1, -0xa8, RZ` waiting on scoreboard 0: 0x001fe200...
        let c = Control::decode(0x001fe20007ffe0ff);
        assert_eq!(c.wait_mask, 0b000001);
        assert!(c.waits_on(0) && !c.waits_on(1));
        // A reuse flag on the first operand: 0x040fe200...
        assert_eq!(Control::decode(0x040fe200078e0241).reuse, 0b0001);
    }

    fn any_control() -> impl Strategy<Value = Control> {
        (
            0u8..16,
            any::<bool>(),
            proptest::option::of(0u8..7),
            proptest::option::of(0u8..7),
            0u8..64,
            0u8..16,
        )
            .prop_map(|(stall, yield_bit, w, r, wait_mask, reuse)| Control {
                stall,
                yield_bit,
                write_barrier: w,
                read_barrier: r,
                wait_mask,
                reuse,
            })
    }

    proptest! {
        #[test]
        fn round_trip(c in any_control(), rest in any::<u64>()) {
            let high = c.encode(rest);
            prop_assert_eq!(Control::decode(high), c);
            prop_assert_eq!(high & !CONTROL_MASK, rest & !CONTROL_MASK);
        }

        #[test]
        fn decode_encode_is_identity(high in any::<u64>()) {
            prop_assert_eq!(Control::decode(high).encode(high), high);
        }
    }
}
