//! The tensor-core sketch's shared tile layout: rows of 16-byte chunks, the chunk index
//! XOR-swizzled by the row, written once ([`SharedTileLayout::offset_in`]) and read as
//! numbers, IR expressions and C.
//!
//! Chunk `x` of row `r` is stored at chunk `x ^ ((r / divisor) % phases)`, so that the
//! eight row addresses one `ldmatrix` 8×8 matrix reads fall in eight different 16-byte
//! bank groups; without the swizzle the rows are plain and such reads conflict whenever
//! a row is a multiple of 128 bytes.

use super::algebra::{C, CText, IndexAlgebra, Numbers};
use crate::expr::{Expr, Scope};

/// Where element (row, column) of one stage's shared tile lives: rows of
/// `row_elements`, 16-byte chunks of `chunk_elements`, chunk index XOR-swizzled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedTileLayout {
    pub rows: i64,
    pub row_elements: i64,
    pub chunk_elements: i64,
    pub swizzle: bool,
}

impl SharedTileLayout {
    pub fn elements(&self) -> i64 {
        self.rows * self.row_elements
    }

    /// Chunks per row.
    pub fn chunks(&self) -> i64 {
        self.row_elements / self.chunk_elements
    }

    /// The swizzle's rows-per-phase divisor and phase count: chunk `x` of row `r` goes
    /// to `x ^ ((r / divisor) % phases)`. Eight consecutive 16-byte chunks span the 32
    /// banks; rows of `chunks < 8` chunks share a bank line `8 / chunks` at a time, so
    /// the phase advances every `8 / chunks` rows.
    pub fn swizzle_parameters(&self) -> (i64, i64) {
        let chunks = self.chunks().max(1);
        ((8 / chunks).max(1), chunks.min(8))
    }

    /// Element offset of (row, column) in the stage's tile, in any index algebra: the
    /// one definition of the layout.
    pub fn offset_in<A: IndexAlgebra>(&self, a: &A, row: A::Value, column: A::Value) -> A::Value {
        let e = self.chunk_elements;
        let chunk = a.div(column.clone(), e);
        let chunk = if self.swizzle {
            let (divisor, phases) = self.swizzle_parameters();
            a.xor(chunk, a.rem(a.div(row.clone(), divisor), phases))
        } else {
            chunk
        };
        let start = a.add(a.mul(row, self.row_elements), a.mul(chunk, e));
        a.add(start, a.rem(column, e))
    }

    /// Element offset of (row, column) in the stage's tile.
    pub fn offset(&self, row: i64, column: i64) -> i64 {
        self.offset_in(&Numbers, row, column)
    }

    /// The offset as an expression over `row` and `column`.
    pub fn expr(&self, scope: &Scope, row: &Expr, column: &Expr) -> Expr {
        self.offset_in(scope, row.clone(), column.clone())
    }

    /// The offset printed over C expressions `row` and `column`.
    pub fn c(&self, row: &str, column: &str) -> String {
        self.offset_in(&CText, C::expr(row), C::expr(column)).text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8 rows that one `ldmatrix` 8×8 matrix reads (same logical chunk) land in 8
    /// different 16-byte bank groups for every row length the sketch builds.
    #[test]
    fn swizzled_ldmatrix_rows_are_conflict_free() {
        for chunk_elements in [8, 4] {
            for chunks in [2, 4, 8, 16] {
                let layout = SharedTileLayout {
                    rows: 64,
                    row_elements: chunks * chunk_elements,
                    chunk_elements,
                    swizzle: true,
                };
                for first in (0..64).step_by(8) {
                    for chunk in 0..chunks {
                        let mut groups: Vec<i64> = (first..first + 8)
                            .map(|r| layout.offset(r, chunk * chunk_elements) / chunk_elements % 8)
                            .collect();
                        groups.sort();
                        groups.dedup();
                        assert_eq!(groups.len(), 8, "{chunks} chunks, rows {first}.., {chunk}");
                    }
                }
                // A bijection within each row.
                for r in 0..64 {
                    let mut cols: Vec<i64> = (0..layout.row_elements)
                        .map(|x| layout.offset(r, x) - r * layout.row_elements)
                        .collect();
                    cols.sort();
                    assert_eq!(cols, (0..layout.row_elements).collect::<Vec<_>>());
                }
                let plain = SharedTileLayout {
                    swizzle: false,
                    ..layout
                };
                if chunks >= 8 {
                    let groups: Vec<i64> = (0..8)
                        .map(|r| plain.offset(r, 0) / chunk_elements % 8)
                        .collect();
                    assert!(
                        groups.iter().all(|&g| g == groups[0]),
                        "plain rows conflict"
                    );
                }
            }
        }
    }

    /// An expression's value, variables bound in order.
    fn eval(e: &Expr, vars: &[i64]) -> i64 {
        match e {
            Expr::Const(c) => *c,
            Expr::Var(v) => vars[v.0],
            Expr::Add(a, b) => eval(a, vars) + eval(b, vars),
            Expr::Mul(a, c) => eval(a, vars) * c,
            Expr::Div(a, c) => eval(a, vars).div_euclid(*c),
            Expr::Rem(a, c) => eval(a, vars).rem_euclid(*c),
            Expr::Xor(a, b) => eval(a, vars) ^ eval(b, vars),
            Expr::BlockIdx | Expr::ThreadIdx | Expr::Min(..) => unreachable!("not in a layout"),
        }
    }

    /// The expression and the C text agree with the numbers, swizzled or not.
    #[test]
    fn the_three_renderings_agree() {
        for swizzle in [false, true] {
            let layout = SharedTileLayout {
                rows: 32,
                row_elements: 32,
                chunk_elements: 8,
                swizzle,
            };
            let mut scope = Scope::new(1, 1);
            let (r, c) = (scope.var("r", 0, 31), scope.var("c", 0, 31));
            let e = layout.expr(&scope, &Expr::Var(r), &Expr::Var(c));
            for row in 0..32 {
                for col in 0..32 {
                    let want = layout.offset(row, col);
                    assert_eq!(eval(&e, &[row, col]), want);
                }
            }
            let text = layout.c("r", "c");
            let expected = if swizzle {
                "(r) * 32 + (((c) / 8) ^ (((r) / 2) % 4)) * 8 + (c) % 8"
            } else {
                "(r) * 32 + ((c) / 8) * 8 + (c) % 8"
            };
            assert_eq!(text, expected);
        }
    }
}
