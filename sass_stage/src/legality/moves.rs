//! An action of the second stage: one instruction swaps with its neighbour, or one of
//! its control-bit fields changes. The agents choose actions (as indices into their
//! policy's output) and the legality rules (`order.rs`, `control.rs`) decide which are
//! allowed; both sides share this definition.
//!
//! Swaps reorder memory instructions (CuAsmRL's game); the control edits are the levers
//! that paid on Hopper where order alone did not (DeepGEMM's yield and reuse flips, see
//! `shared/REFERENCE.md`): flipping the yield hint, setting or clearing operand-reuse
//! flags, and shortening or lengthening the stall count.

/// What an action does to the instruction at its row.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Swap with the instruction above.
    Up,
    /// Swap with the instruction below.
    Down,
    /// Flip the yield hint (a yielding instruction loses its reuse flags).
    Yield,
    /// Set every operand-reuse flag the next instruction can use.
    ReuseSet,
    /// Clear its operand-reuse flags.
    ReuseClear,
    /// One stall cycle less before the next instruction issues.
    StallDown,
    /// One stall cycle more.
    StallUp,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Up,
        Kind::Down,
        Kind::Yield,
        Kind::ReuseSet,
        Kind::ReuseClear,
        Kind::StallDown,
        Kind::StallUp,
    ];

    /// Whether the action permutes instructions (rather than editing control bits).
    pub fn is_swap(self) -> bool {
        matches!(self, Kind::Up | Kind::Down)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Up => "up",
            Kind::Down => "down",
            Kind::Yield => "yield",
            Kind::ReuseSet => "reuse_set",
            Kind::ReuseClear => "reuse_clear",
            Kind::StallDown => "stall_down",
            Kind::StallUp => "stall_up",
        }
    }
}

/// Actions per instruction row in the policy's output.
pub const KINDS: usize = Kind::ALL.len();

/// An action on the instruction at `row` (its current position). As an index into the
/// policy's output: `KINDS * row + kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Action {
    pub row: usize,
    pub kind: Kind,
}

impl Action {
    pub fn index(self) -> usize {
        KINDS * self.row + self.kind as usize
    }

    pub fn from_index(index: usize) -> Action {
        Action {
            row: index / KINDS,
            kind: Kind::ALL[index % KINDS],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_round_trip() {
        for i in 0..5 * KINDS {
            assert_eq!(Action::from_index(i).index(), i);
        }
        let a = Action {
            row: 3,
            kind: Kind::StallDown,
        };
        assert_eq!(Action::from_index(a.index()), a);
    }
}
