//! The copies of the tensor-core sketch, as data: how a shared tile is filled from
//! global memory (`cp.async` of 4, 8 or 16 bytes with zero fill, or, for one half
//! element, a plain load and store), and how `ldmatrix` reads MMA fragments back (which
//! lane gives the address of which 8×8 matrix row).
//!
//! `ldmatrix.m8n8` moves 8×8 matrices of 16-bit elements: lane `l` gives the shared
//! address of row `l % 8` of matrix `l / 8` (lanes 0-15 only for `.x2`), each row one
//! 16-byte chunk; lane `l` then receives, in its register `j`, elements `2·(l % 4)` and
//! `+1` of row `l / 4` of matrix `j` (`.trans`: of the transposed matrix).

use super::fragment::{Index::Lane, Term};

/// Bytes of a shared tile's chunk: one `ldmatrix` matrix row, the widest `cp.async`.
pub const CHUNK_BYTES: u32 = 16;

/// One copy of the fill from global into shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillCopy {
    /// `cp.async.{ca,cg}.shared.global` of `bytes` (4, 8 or 16), with a source size of
    /// 0 to zero-fill; `.cg` (bypassing L1) only exists for 16 bytes.
    CpAsync { bytes: u32 },
    /// One 2-byte element (which `cp.async` cannot move): an ordinary load and store.
    Element,
}

impl FillCopy {
    /// The copy of `bytes` bytes of elements of `element_bytes`, if one exists.
    pub fn of(bytes: u32, element_bytes: u32) -> Option<FillCopy> {
        match bytes {
            4 | 8 | 16 => Some(FillCopy::CpAsync { bytes }),
            2 if element_bytes == 2 => Some(FillCopy::Element),
            _ => None,
        }
    }

    /// `cp.async`'s cache operator.
    pub fn cache(bytes: u32) -> &'static str {
        if bytes == 16 { "cg" } else { "ca" }
    }
}

/// One `ldmatrix` form as the sketch uses it: the PTX shape and, from the fragment's
/// origin in the stored tile, the tile row and 16-byte chunk whose address each lane
/// gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ldmatrix {
    /// After `ldmatrix.sync.aligned.m8n8.`: `x4`, `x2`, `x4.trans`, `x2.trans`.
    pub shape: &'static str,
    pub rows: &'static [Term],
    pub chunks: &'static [Term],
    /// Matrices moved (32-bit registers per lane).
    pub matrices: i64,
}

/// Rows of one 8×8 matrix.
pub const MATRIX_ROWS: i64 = 8;

const L_MOD_8: Term = Term::new(Lane, 1, 8, 1);
const L_MOD_16: Term = Term::new(Lane, 1, 16, 1);
const L_DIV_16: Term = Term::new(Lane, 16, 0, 1);

impl Ldmatrix {
    /// A's 16 × k-step fragment (k-step 32 bytes, two chunks): matrices (rows 0-7,
    /// chunk 0), (rows 8-15, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 1): the
    /// registers `mma`'s A fragment takes, in order.
    pub const A: Ldmatrix = Ldmatrix {
        shape: "x4",
        rows: &[L_MOD_16],
        chunks: &[L_DIV_16],
        matrices: 4,
    };
    /// Two K-major B fragments (n 0-7 and 8-15, stored as rows): matrices (n 0-7,
    /// chunk 0), (n 0-7, chunk 1), then n 8-15 likewise.
    pub const B_K_MAJOR_PAIR: Ldmatrix = Ldmatrix {
        shape: "x4",
        rows: &[L_MOD_8, Term::new(Lane, 16, 0, 8)],
        chunks: &[Term::new(Lane, 8, 2, 1)],
        matrices: 4,
    };
    pub const B_K_MAJOR: Ldmatrix = Ldmatrix {
        shape: "x2",
        rows: &[L_MOD_8],
        chunks: &[Term::new(Lane, 8, 2, 1)],
        matrices: 2,
    };
    /// Two N-major B fragments (k stored as rows), transposed on the way: matrices
    /// (k 0-7, n chunk 0), (k 8-15, chunk 0), then the next 8 columns.
    pub const B_N_MAJOR_PAIR: Ldmatrix = Ldmatrix {
        shape: "x4.trans",
        rows: &[L_MOD_16],
        chunks: &[L_DIV_16],
        matrices: 4,
    };
    pub const B_N_MAJOR: Ldmatrix = Ldmatrix {
        shape: "x2.trans",
        rows: &[L_MOD_16],
        chunks: &[],
        matrices: 2,
    };

    /// The form that loads `count` (1 or 2) B fragments.
    pub fn b(k_major: bool, count: usize) -> Ldmatrix {
        match (k_major, count == 2) {
            (true, true) => Ldmatrix::B_K_MAJOR_PAIR,
            (true, false) => Ldmatrix::B_K_MAJOR,
            (false, true) => Ldmatrix::B_N_MAJOR_PAIR,
            (false, false) => Ldmatrix::B_N_MAJOR,
        }
    }

    /// Bytes one instruction moves per warp.
    pub fn bytes(&self) -> i64 {
        self.matrices * MATRIX_ROWS * i64::from(CHUNK_BYTES)
    }

    /// (tile row, chunk) whose address lane `lane` gives.
    pub fn address(&self, lane: i64) -> (i64, i64) {
        (
            super::fragment::at(self.rows, lane, 0),
            super::fragment::at(self.chunks, lane, 0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::atom::mma::{BF16_M16N8K16, FP16_M16N8K16};

    /// Register `j` of lane `l` holds elements (row `l / 4`, columns `2·(l % 4)`, `+1`)
    /// of matrix `j`, whose rows start at the addresses lanes `8j..8j+8` gave.
    fn delivered(form: &Ldmatrix, lane: i64, register: i64) -> [(i64, i64); 2] {
        let (row, chunk) = form.address(8 * register + lane / 4);
        let column = 8 * chunk + 2 * (lane % 4);
        [(row, column), (row, column + 1)]
    }

    /// `ldmatrix.x4` at the A addresses delivers exactly `mma`'s A fragment, and the
    /// K-major pair two B fragments (their n and k as the tile stores them).
    #[test]
    fn ldmatrix_delivers_the_mma_fragments() {
        for atom in [FP16_M16N8K16, BF16_M16N8K16] {
            for lane in 0..32 {
                for v in 0..atom.a.values {
                    let got = delivered(&Ldmatrix::A, lane, v / 2)[(v % 2) as usize];
                    assert_eq!(got, atom.a.coord(lane, v), "A lane {lane} value {v}");
                }
                for frag in 0..2 {
                    for v in 0..atom.b.values {
                        let reg = 2 * frag + v / 2;
                        let (n, k) =
                            delivered(&Ldmatrix::B_K_MAJOR_PAIR, lane, reg)[(v % 2) as usize];
                        let (bk, bn) = atom.b.coord(lane, v);
                        assert_eq!((n, k), (bn + 8 * frag, bk), "B lane {lane} value {v}");
                    }
                }
            }
        }
        assert_eq!(Ldmatrix::A.bytes(), 512);
    }

    #[test]
    fn cp_async_moves_4_8_or_16_bytes_and_one_half_is_a_plain_copy() {
        assert_eq!(FillCopy::of(16, 2), Some(FillCopy::CpAsync { bytes: 16 }));
        assert_eq!(FillCopy::of(2, 2), Some(FillCopy::Element));
        assert_eq!(FillCopy::of(2, 4), None);
        assert_eq!(FillCopy::of(12, 4), None);
        assert_eq!(FillCopy::cache(16), "cg");
        assert_eq!(FillCopy::cache(8), "ca");
    }
}
