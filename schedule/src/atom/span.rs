//! Row-span staging's shared A operand: raw runs of an input row, one per 16-pixel
//! group, read as an MMA tile whose rows overlap (`crate::row_span` says why).
//!
//! Row `ρ` of group `g` (tile row `16g + ρ`) and reduction column `k` of the tile is
//! element `g · group_elements + ρ · row_step + k + skew` of the stage: neighbouring
//! output pixels' windows are `row_step` elements apart in the same run. Written once
//! ([`SpanLayout::offset_in`]) and read as numbers (interpreter), IR (lowering) and C
//! (code generation), like `SharedTileLayout`.

use super::SharedTileLayout;
use super::algebra::{C, CText, IndexAlgebra, Numbers};

/// Rows of one MMA tile: each group of that many output pixels has its own run.
pub const GROUP_ROWS: i64 = crate::atom::mma::M;

/// Where element (row, k) of one stage's row-span tile lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanLayout {
    /// Pixel groups of `GROUP_ROWS` rows.
    pub groups: i64,
    /// Elements of one group's run (a whole number of 16-byte copies).
    pub group_elements: i64,
    /// Elements between neighbouring rows' windows: the convolution's stride times its
    /// channels.
    pub row_step: i64,
    /// Elements before row 0's column 0 in its group's run.
    pub skew: i64,
}

impl SpanLayout {
    pub fn elements(&self) -> i64 {
        self.groups * self.group_elements
    }

    /// Element offset of (row, k), in any index algebra: the one definition.
    pub fn offset_in<A: IndexAlgebra>(&self, a: &A, row: A::Value, k: A::Value) -> A::Value {
        let group = a.mul(a.div(row.clone(), GROUP_ROWS), self.group_elements);
        let within = a.mul(a.rem(row, GROUP_ROWS), self.row_step);
        a.add(a.add(group, within), a.add(k, a.constant(self.skew)))
    }

    pub fn offset(&self, row: i64, k: i64) -> i64 {
        self.offset_in(&Numbers, row, k)
    }

    pub fn c(&self, row: &str, k: &str) -> String {
        self.offset_in(&CText, C::expr(row), C::expr(k)).text
    }
}

/// How a fragment's operand lies in a stage: a (swizzled) tile, or row spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperandLayout {
    Tile(SharedTileLayout),
    Span(SpanLayout),
}

impl OperandLayout {
    /// Element offset of (row, column) in the stage.
    pub fn offset(&self, row: i64, column: i64) -> i64 {
        match self {
            OperandLayout::Tile(t) => t.offset(row, column),
            OperandLayout::Span(s) => s.offset(row, column),
        }
    }

    pub fn elements(&self) -> i64 {
        match self {
            OperandLayout::Tile(t) => t.elements(),
            OperandLayout::Span(s) => s.elements(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_overlap_within_a_group_and_groups_are_apart() {
        let s = SpanLayout {
            groups: 2,
            group_elements: 128,
            row_step: 6,
            skew: 6,
        };
        assert_eq!(s.offset(0, 0), 6);
        assert_eq!(s.offset(1, 0), 12);
        // Row 1's window starts where row 0's seventh tap is.
        assert_eq!(s.offset(1, 3), s.offset(0, 9));
        assert_eq!(s.offset(16, 5), 128 + 11);
        assert_eq!(s.c("r", "k"), "((r) / 16) * 128 + ((r) % 16) * 6 + k + 6");
    }
}
