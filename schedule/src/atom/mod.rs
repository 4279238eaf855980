//! Instruction knowledge as data: the idea of CuTe's MMA and copy atoms, in this
//! project's own terms. An atom says what one instruction does to data (its shape, which
//! lane holds which element, where a copy puts its bytes), once; lowering, code
//! generation, the CPU interpreter and the features all read it from here, so that a new
//! instruction family is one more atom rather than one more copy of its layouts in each
//! of them.
//!
//! - `algebra`: the index arithmetic a layout is written in, evaluated as numbers, built
//!   as IR expressions or printed as C from one definition.
//! - `swizzle`: the XOR-swizzled shared tile layout of the tensor-core sketch.
//! - `span`: row-span staging's A operand, raw input-row runs read as overlapping rows.
//! - `fragment`: (lane, value) → (row, column) maps of per-lane fragments.
//! - `mma`: the `mma.sync` instructions (shape, PTX, A/B/C fragment layouts).
//! - `copy`: the copies that fill and read shared tiles (`cp.async`, plain loads,
//!   `ldmatrix`).
//! - `tma`: the TMA tiled copy's box and the hardware's rules on it.
//! - `wgmma`: Hopper's warpgroup MMA (shape, shared-memory matrix descriptors and their
//!   swizzles, the accumulator layout), for the sketch that issue 29 builds.

pub mod algebra;
pub mod copy;
pub mod fragment;
pub mod mma;
pub mod span;
pub mod swizzle;
pub mod tma;
pub mod wgmma;

pub use algebra::{CText, IndexAlgebra, Numbers};
pub use copy::{CHUNK_BYTES, FillCopy, Ldmatrix};
pub use fragment::{FragmentLayout, Index, Term};
pub use mma::MmaAtom;
pub use span::{OperandLayout, SpanLayout};
pub use swizzle::SharedTileLayout;
