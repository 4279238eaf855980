//! The warp-wide `mma.sync` instructions the tensor-core sketch issues, as data: shape,
//! PTX, and the A, B and C fragment layouts (PTX ISA, "Matrix Fragments for
//! mma.m16n8k16" and "for mma.m16n8k8", `.tf32`). Every lane holds `values` elements of
//! each fragment; `g = lane / 4` and `q = lane % 4` pick them:
//!
//! - C (f32 accumulators, both shapes): value `v` at row `g + 8·(v / 2)`, column
//!   `2q + v % 2`.
//! - m16n8k16 (fp16, bf16; 2 elements per 32-bit register): A value `v` at row
//!   `g + 8·((v / 2) % 2)`, column `2q + v % 2 + 8·(v / 4)`; B value `v` at k
//!   `2q + v % 2 + 8·(v / 2)`, n `g`.
//! - m16n8k8 (TF32, one element per register): A value `v` at row `g + 8·(v % 2)`,
//!   column `q + 4·(v / 2)`; B value `v` at k `q + 4·v`, n `g`.
//!
//! A is row-major `m × k`, B is `k × n` (the `.row.col` forms: B's registers hold k-runs).

use super::fragment::{FragmentLayout, Index::Lane, Index::Value, Term};
use crate::task::DType;

/// One `mma.sync` instruction: `D[m × n] = A[m × k] · B[k × n] + C`, in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaAtom {
    pub m: i64,
    pub n: i64,
    pub k: i64,
    /// The PTX shape and types after `mma.sync.aligned.`.
    pub ptx: &'static str,
    pub a: FragmentLayout,
    pub b: FragmentLayout,
    pub c: FragmentLayout,
    /// 32-bit registers per lane of the A and B fragments.
    pub a_registers: usize,
    pub b_registers: usize,
}

/// M and N of every `mma.sync` shape the sketch issues (m16n8k16, m16n8k8), so that
/// a warp's tiling does not depend on the element type.
pub const M: i64 = 16;
pub const N: i64 = 8;

const ROW_G: Term = Term::new(Lane, 4, 0, 1);
const COL_2Q: Term = Term::new(Lane, 1, 4, 2);
const Q: Term = Term::new(Lane, 1, 4, 1);

/// The accumulator layout both shapes share.
pub const C_M16N8: FragmentLayout = FragmentLayout {
    row: &[ROW_G, Term::new(Value, 2, 0, 8)],
    column: &[COL_2Q, Term::new(Value, 1, 2, 1)],
    values: 4,
};

const A_M16K16: FragmentLayout = FragmentLayout {
    row: &[ROW_G, Term::new(Value, 2, 2, 8)],
    column: &[COL_2Q, Term::new(Value, 1, 2, 1), Term::new(Value, 4, 0, 8)],
    values: 8,
};

const B_K16N8: FragmentLayout = FragmentLayout {
    row: &[COL_2Q, Term::new(Value, 1, 2, 1), Term::new(Value, 2, 0, 8)],
    column: &[ROW_G],
    values: 4,
};

const fn m16n8k16(ptx: &'static str) -> MmaAtom {
    MmaAtom {
        m: M,
        n: N,
        k: 16,
        ptx,
        a: A_M16K16,
        b: B_K16N8,
        c: C_M16N8,
        a_registers: 4,
        b_registers: 2,
    }
}

pub const FP16_M16N8K16: MmaAtom = m16n8k16("m16n8k16.row.col.f32.f16.f16.f32");
pub const BF16_M16N8K16: MmaAtom = m16n8k16("m16n8k16.row.col.f32.bf16.bf16.f32");
pub const TF32_M16N8K8: MmaAtom = MmaAtom {
    m: M,
    n: N,
    k: 8,
    ptx: "m16n8k8.row.col.f32.tf32.tf32.f32",
    a: FragmentLayout {
        row: &[ROW_G, Term::new(Value, 1, 2, 8)],
        column: &[Q, Term::new(Value, 2, 0, 4)],
        values: 4,
    },
    b: FragmentLayout {
        row: &[Q, Term::new(Value, 1, 0, 4)],
        column: &[ROW_G],
        values: 2,
    },
    c: C_M16N8,
    a_registers: 4,
    b_registers: 2,
};

impl MmaAtom {
    /// The instruction for inputs of `dtype`; float32 has none (it stays on CUDA cores).
    pub fn for_dtype(dtype: DType) -> Option<&'static MmaAtom> {
        match dtype {
            DType::Fp16 => Some(&FP16_M16N8K16),
            DType::Bf16 => Some(&BF16_M16N8K16),
            DType::Tf32 => Some(&TF32_M16N8K8),
            DType::F32 => None,
        }
    }

    /// The instruction that sizes a tensor-core state of `dtype`: its own, and for
    /// float32, which has none (such states never validate), TF32's, which moves the
    /// same 4-byte elements.
    pub fn sizing(dtype: DType) -> &'static MmaAtom {
        MmaAtom::for_dtype(dtype).unwrap_or(&TF32_M16N8K8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each layout puts the lanes' values on every element of its matrix exactly once.
    #[test]
    fn fragments_cover_their_matrices_once() {
        for atom in [FP16_M16N8K16, BF16_M16N8K16, TF32_M16N8K8] {
            for (layout, rows, cols) in [
                (atom.a, atom.m, atom.k),
                (atom.b, atom.k, atom.n),
                (atom.c, atom.m, atom.n),
            ] {
                let mut seen = vec![0; (rows * cols) as usize];
                for lane in 0..32 {
                    for v in 0..layout.values {
                        let (r, c) = layout.coord(lane, v);
                        assert!(r < rows && c < cols, "{}: ({r}, {c})", atom.ptx);
                        seen[(r * cols + c) as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "{}", atom.ptx);
            }
        }
    }

    #[test]
    fn only_tensor_core_types_have_an_instruction() {
        assert_eq!(MmaAtom::for_dtype(DType::Fp16).unwrap().k, 16);
        assert_eq!(MmaAtom::for_dtype(DType::Tf32).unwrap().k, 8);
        assert!(MmaAtom::for_dtype(DType::F32).is_none());
        for d in [DType::Fp16, DType::Bf16, DType::Tf32] {
            let atom = MmaAtom::for_dtype(d).unwrap();
            assert_eq!(
                atom.k * i64::from(d.bytes()),
                32,
                "one k-step is 32 bytes of a row"
            );
            let ty = match d {
                DType::Fp16 => ".f16.",
                DType::Bf16 => ".bf16.",
                _ => ".tf32.",
            };
            assert!(atom.ptx.contains(ty), "{}", atom.ptx);
        }
    }
}
