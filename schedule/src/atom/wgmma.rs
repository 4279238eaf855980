//! Hopper's warpgroup MMA (`wgmma.mma_async`, sm_90a only) as data: its shape, the
//! 64-bit shared-memory matrix descriptor through which it reads A and B, the swizzles
//! the descriptor names, and the f32 accumulator layout over the warpgroup's 128
//! threads. Facts from the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply",
//! "Matrix Descriptor Format") as CUTLASS's `GmmaDescriptor` also encodes them.
//!
//! One instruction multiplies a 64×k tile of A by a k×N tile of B, N a multiple of 8 up
//! to 256, into 64×N f32 accumulators spread over the four warps of a warpgroup: warp
//! `w` holds rows `16w..16w+16` in the `mma.sync` C-fragment pattern, repeated every 8
//! columns. k is 32 bytes of the type: 16 fp16 or bf16 elements, 8 TF32 ones (f32 data
//! whose low mantissa bits the instruction ignores). TF32 operands must be K-major.
//!
//! The swizzles are those of [`SharedTileLayout`]: a K-major tile whose rows are 32, 64
//! or 128 bytes, the 16-byte chunk index XOR-ed with the row within each 8-row group
//! (`SharedTileLayout::swizzle_parameters`), is exactly the hardware's 32B, 64B or 128B
//! swizzle of a tile whose base is aligned to its 8-row atom (256, 512 or 1024 bytes).

use super::fragment::{FragmentLayout, Index, Term};
use super::swizzle::SharedTileLayout;
use crate::task::DType;

/// A shared-memory swizzle a descriptor (and a TMA box) can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Swizzle {
    /// No swizzle: the tile in 8×16-byte core matrices ("interleave").
    None,
    B32,
    B64,
    B128,
}

impl Swizzle {
    /// The descriptor's 2-bit layout field (bits 62–63).
    pub fn code(self) -> u64 {
        match self {
            Swizzle::None => 0,
            Swizzle::B128 => 1,
            Swizzle::B64 => 2,
            Swizzle::B32 => 3,
        }
    }

    /// Bytes of one swizzled row (the span the chunk XOR permutes within).
    pub fn row_bytes(self) -> Option<i64> {
        match self {
            Swizzle::None => None,
            Swizzle::B32 => Some(32),
            Swizzle::B64 => Some(64),
            Swizzle::B128 => Some(128),
        }
    }

    /// The swizzle whose rows span `bytes` (32, 64 or 128); None for any other span.
    pub fn spanning(bytes: i64) -> Option<Swizzle> {
        [Swizzle::B32, Swizzle::B64, Swizzle::B128]
            .into_iter()
            .find(|s| s.row_bytes() == Some(bytes))
    }

    /// The swizzle of a K-major shared tile, if the hardware has one for it: a swizzled
    /// tile of 32-, 64- or 128-byte rows.
    pub fn of(layout: &SharedTileLayout, element_bytes: i64) -> Option<Swizzle> {
        if !layout.swizzle {
            return Some(Swizzle::None);
        }
        Swizzle::spanning(layout.row_elements * element_bytes)
    }
}

/// A shared-memory matrix descriptor, before encoding: byte addresses and offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixDescriptor {
    /// Shared-memory byte address of the operand's first element.
    pub start: u32,
    /// Leading-dimension byte offset (unused by swizzled K-major layouts).
    pub leading: u32,
    /// Stride-dimension byte offset: from one 8-row group to the next.
    pub stride: u32,
    pub swizzle: Swizzle,
}

impl MatrixDescriptor {
    /// The 64-bit form: start address, leading and stride byte offsets in 16-byte units
    /// (14 bits each at bits 0, 16 and 32), the base offset 0 (tiles aligned to their
    /// swizzle atom) and the layout at bits 62–63.
    pub fn encode(&self) -> u64 {
        let field = |bytes: u32| (u64::from(bytes) >> 4) & 0x3fff;
        field(self.start)
            | field(self.leading) << 16
            | field(self.stride) << 32
            | self.swizzle.code() << 62
    }
}

/// Which dimension of an operand is contiguous in its shared tile: K (the instruction's
/// default) or its M or N ("transposed", `imm-trans-a`/`imm-trans-b` = 1; fp16 and bf16
/// only: [`WgmmaAtom::transposes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Major {
    K,
    MN,
}

/// How an operand lies in shared memory, as its descriptor tells the hardware (the start
/// address aside): the canonical layouts of the PTX ISA ("Shared Memory Matrix Layout";
/// CUTLASS writes them as CuTe layouts in `mma_traits_sm90_gmma.hpp`), swizzled only.
/// One swizzle atom is 8 rows of `span` bytes (32, 64 or 128).
///
/// - K-major: row `mn` of the operand is `span` bytes of K; 8-row groups are `stride`
///   bytes apart (`leading` is unused). One instruction's k step reads 32 bytes of each
///   row.
/// - MN-major: a K row holds `span` bytes of M or N; atoms along M/N are `leading`
///   bytes apart, 8-row groups of K `stride` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OperandLayout {
    pub major: Major,
    pub swizzle: Swizzle,
    pub leading: u32,
    pub stride: u32,
    /// Bytes of one element: 2 (fp16, bf16) or 4 (TF32).
    pub element_bytes: i64,
}

impl OperandLayout {
    /// A K-major operand of `atom`'s type whose rows are the swizzle's span long, stored
    /// row after row.
    pub fn k_major(atom: &WgmmaAtom, swizzle: Swizzle) -> OperandLayout {
        let span = swizzle.row_bytes().unwrap_or(16) as u32;
        OperandLayout {
            major: Major::K,
            swizzle,
            leading: 16,
            stride: 8 * span,
            element_bytes: atom.element_bytes,
        }
    }

    /// An MN-major operand of `atom`'s type whose K rows are one swizzle span wide, its
    /// M/N atoms `atom_bytes` apart.
    pub fn mn_major(atom: &WgmmaAtom, swizzle: Swizzle, atom_bytes: u32) -> OperandLayout {
        let span = swizzle.row_bytes().unwrap_or(16) as u32;
        OperandLayout {
            major: Major::MN,
            swizzle,
            leading: atom_bytes,
            stride: 8 * span,
            element_bytes: atom.element_bytes,
        }
    }

    /// Bytes of one swizzle row.
    pub fn span(&self) -> i64 {
        self.swizzle.row_bytes().unwrap_or(16)
    }

    /// Byte offset from the descriptor's start, before the swizzle, of operand element
    /// (`mn`, `k`) (`k` within one instruction's k): what the hardware reads.
    pub fn offset(&self, mn: i64, k: i64) -> i64 {
        let span = self.span();
        let bytes = self.element_bytes;
        let (leading, stride) = (i64::from(self.leading), i64::from(self.stride));
        match self.major {
            Major::K => (mn % 8) * span + (mn / 8) * stride + k * bytes,
            Major::MN => {
                let per_row = span / bytes;
                (mn % per_row) * bytes
                    + (mn / per_row) * leading
                    + (k % 8) * span
                    + (k / 8) * stride
            }
        }
    }

    /// Bytes the start moves from one instruction's k step to the next: 32 bytes of
    /// each K-major row, or two 8-row groups of K rows (k16, MN-major).
    pub fn k_step_bytes(&self) -> i64 {
        match self.major {
            Major::K => K_STEP_BYTES,
            Major::MN => 2 * i64::from(self.stride),
        }
    }

    /// The descriptor at shared byte address `start`.
    pub fn descriptor(&self, start: u32) -> MatrixDescriptor {
        MatrixDescriptor {
            start,
            leading: self.leading,
            stride: self.stride,
            swizzle: self.swizzle,
        }
    }

    /// The C expression of the descriptor at the shared address `start` (a 32-bit C
    /// expression).
    pub fn descriptor_c(&self, start: &str) -> String {
        let fixed = self.descriptor(0).encode();
        format!("(0x{fixed:016x}ull | (unsigned long long)((({start}) >> 4) & 0x3fff))")
    }
}

/// Where the hardware puts byte `address` of shared memory under `swizzle`: the 16-byte
/// chunk index within a span XOR-ed with the address's 128-byte line within the atom
/// (CuTe's `Swizzle<b, 4, 3>`, b = 1, 2, 3 for 32B, 64B, 128B). TMA writes and wgmma
/// reads both apply it to absolute addresses, so tiles sit at multiples of their atom.
pub fn swizzle_address(address: i64, swizzle: Swizzle) -> i64 {
    let bits = match swizzle {
        Swizzle::None => return address,
        Swizzle::B32 => 1,
        Swizzle::B64 => 3,
        Swizzle::B128 => 7,
    };
    address ^ (((address >> 7) & bits) << 4)
}

/// A warpgroup MMA: A 64×k, B k×n, f32 accumulators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgmmaAtom {
    pub m: i64,
    pub k: i64,
    /// The operands' PTX type (`f16`, `bf16`, `tf32`): the instruction is
    /// `m64n{n}k{k}.f32.{a_type}.{a_type}` ([`WgmmaAtom::ptx`]).
    pub a_type: &'static str,
    /// Bytes of one operand element in shared memory.
    pub element_bytes: i64,
    /// Whether an operand may be MN-major (the instruction's `imm-trans` arguments,
    /// which only 16-bit types have).
    pub transposes: bool,
}

/// Threads of a warpgroup.
pub const WARPGROUP_THREADS: i64 = 128;

/// Bytes of K one instruction reads from each row of a K-major operand, whatever the
/// type.
pub const K_STEP_BYTES: i64 = 32;

pub const FP16_M64K16: WgmmaAtom = WgmmaAtom {
    m: 64,
    k: 16,
    a_type: "f16",
    element_bytes: 2,
    transposes: true,
};
pub const BF16_M64K16: WgmmaAtom = WgmmaAtom {
    m: 64,
    k: 16,
    a_type: "bf16",
    element_bytes: 2,
    transposes: true,
};
pub const TF32_M64K8: WgmmaAtom = WgmmaAtom {
    m: 64,
    k: 8,
    a_type: "tf32",
    element_bytes: 4,
    transposes: false,
};

/// The accumulator's row: warp `t / 32` holds 16 rows, lane `(t % 32) / 4` within
/// them, values 2 and 3 of each group of four 8 rows further.
const D_ROW: &[Term] = &[
    Term::new(Index::Lane, 32, 0, 16),
    Term::new(Index::Lane, 4, 8, 1),
    Term::new(Index::Value, 2, 2, 8),
];
/// The accumulator's column: two consecutive per lane quad position, the next 8
/// columns every four values.
const D_COLUMN: &[Term] = &[
    Term::new(Index::Lane, 1, 4, 2),
    Term::new(Index::Value, 1, 2, 1),
    Term::new(Index::Value, 4, 0, 8),
];

impl WgmmaAtom {
    /// The atom of a tensor-core element type (plain f32 has none).
    pub fn for_dtype(dtype: DType) -> Option<&'static WgmmaAtom> {
        match dtype {
            DType::Fp16 => Some(&FP16_M64K16),
            DType::Bf16 => Some(&BF16_M64K16),
            DType::Tf32 => Some(&TF32_M64K8),
            DType::F32 => None,
        }
    }

    /// Whether `n` is a width the instruction has.
    pub fn n_valid(n: i64) -> bool {
        (8..=256).contains(&n) && n % 8 == 0
    }

    /// The f32 accumulators of a 64×n product over the warpgroup's threads
    /// ("lane" here is the thread in the warpgroup, 0..128): n / 2 values per thread.
    pub fn accumulator(n: i64) -> FragmentLayout {
        FragmentLayout {
            row: D_ROW,
            column: D_COLUMN,
            values: n / 2,
        }
    }

    /// `wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{a}.{a}`: both operands from shared
    /// memory through descriptors, accumulating into the registers when `scale-d` is 1.
    pub fn ptx(&self, n: i64) -> String {
        format!(
            "wgmma.mma_async.sync.aligned.m{}n{n}k{}.f32.{t}.{t}",
            self.m,
            self.k,
            t = self.a_type
        )
    }

    /// The C statement that issues one instruction of width `n`, accumulating into
    /// `acc[first..first + n/2]` (the C array `acc`), its operands the descriptors that
    /// the 64-bit C expressions `a` and `b` give, B stored `b_major`.
    pub fn issue_c(
        &self,
        n: i64,
        (acc, first): (&str, i64),
        (a, b): (&str, &str),
        b_major: Major,
    ) -> String {
        let values = Self::accumulator(n).values;
        let registers: Vec<String> = (0..values).map(|v| format!("%{v}")).collect();
        let outputs: Vec<String> = (0..values)
            .map(|v| format!("\"+f\"({acc}[{}])", first + v))
            .collect();
        // The scales of A and B (1: not negated), then, for 16-bit types only, whether
        // A and B are MN-major.
        let immediates = if self.transposes {
            format!("1, 1, 0, {}", u8::from(b_major == Major::MN))
        } else {
            "1, 1".to_string()
        };
        format!(
            "asm volatile(\"{{ .reg .pred p; setp.ne.b32 p, %{}, 0; {} {{{}}}, %{values}, %{}, p, {immediates}; }}\" \
             : {} : \"l\"({a}), \"l\"({b}), \"r\"(1) : \"memory\");",
            values + 2,
            self.ptx(n),
            registers.join(", "),
            values + 1,
            outputs.join(", "),
        )
    }

    /// The C statements that multiply one K tile of K-major operands whose rows are one
    /// `swizzle` span long (so the tile is `span / 32` k-steps): per step, the
    /// descriptors of A and B at shared byte addresses `a` and `b` (32-bit C
    /// expressions) advanced by the step's bytes within the row; the hardware applies
    /// the swizzle to the advanced addresses.
    pub fn k_tile_c(
        &self,
        n: i64,
        acc: &str,
        (a, b): (&str, &str),
        swizzle: Swizzle,
    ) -> Vec<String> {
        let layout = OperandLayout::k_major(self, swizzle);
        let step_bytes = layout.k_step_bytes();
        (0..layout.span() / step_bytes)
            .map(|step| {
                let offset = step * step_bytes;
                let a = layout.descriptor_c(&format!("{a} + {offset}"));
                let b = layout.descriptor_c(&format!("{b} + {offset}"));
                self.issue_c(n, (acc, 0), (&a, &b), Major::K)
            })
            .collect()
    }
}

/// `wgmma.fence`: before the first instruction that touches accumulators (or operand
/// registers) other code wrote.
pub const FENCE_C: &str = "asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");";

/// `wgmma.commit_group`: the instructions issued since the last commit form a group.
pub const COMMIT_C: &str = "asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");";

/// `wgmma.wait_group pending`: all but the `pending` newest groups have completed.
pub fn wait_c(pending: u32) -> String {
    format!("asm volatile(\"wgmma.wait_group.sync.aligned {pending};\" ::: \"memory\");")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn descriptor_fields_land_in_their_bits() {
        let layout = OperandLayout::k_major(&FP16_M64K16, Swizzle::B128);
        let bits = layout.descriptor(0x1400).encode();
        assert_eq!(bits & 0x3fff, 0x1400 >> 4);
        assert_eq!((bits >> 16) & 0x3fff, 1);
        assert_eq!((bits >> 32) & 0x3fff, 1024 >> 4);
        assert_eq!(bits >> 62, 1);
        assert_eq!((bits >> 49) & 7, 0, "base offset");
        // The C form gives the same bits once the start is filled in.
        let fixed = layout.descriptor(0).encode();
        assert_eq!(fixed | (0x1400 >> 4), bits);
        assert!(
            layout
                .descriptor_c("a")
                .starts_with(&format!("(0x{fixed:016x}ull"))
        );
    }

    /// What a descriptor reads is where a TMA box put it: a K-major operand is the
    /// box's rows (one per M or N, the swizzle's span of K each); an MN-major one is
    /// boxes of one span of M or N per K row, `box` bytes apart.
    #[test]
    fn descriptors_read_what_tma_boxes_wrote() {
        for (swizzle, span) in [(Swizzle::B32, 32), (Swizzle::B64, 64), (Swizzle::B128, 128)] {
            let tile = |rows, bytes: i64| SharedTileLayout {
                rows,
                row_elements: span / bytes,
                chunk_elements: 16 / bytes,
                swizzle: true,
            };
            for atom in [&FP16_M64K16, &TF32_M64K8] {
                let bytes = atom.element_bytes;
                let k_major = OperandLayout::k_major(atom, swizzle);
                let rows = tile(128, bytes);
                for step in 0..span / K_STEP_BYTES {
                    for mn in 0..128 {
                        for k in 0..atom.k {
                            let at = step * k_major.k_step_bytes() + k_major.offset(mn, k);
                            let element = swizzle_address(at, swizzle) / bytes;
                            let expected = rows.offset(mn, step * atom.k + k);
                            assert_eq!(element, expected, "{} {span} {mn} {k}", atom.a_type);
                        }
                    }
                }
            }
            let per_row = span / 2;
            let k_rows = 64;
            let boxed = tile(k_rows, 2);
            let box_bytes = (k_rows * span) as u32;
            let mn_major = OperandLayout::mn_major(&FP16_M64K16, swizzle, box_bytes);
            for step in 0..k_rows / 16 {
                for n in 0..4 * per_row {
                    for k in 0..16 {
                        let at = step * mn_major.k_step_bytes() + mn_major.offset(n, k);
                        let element = swizzle_address(at, swizzle) / 2;
                        let expected = (n / per_row) * boxed.elements()
                            + boxed.offset(step * 16 + k, n % per_row);
                        assert_eq!(element, expected, "{span} {n} {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_accumulator_covers_the_tile_once() {
        for n in [8, 64, 136, 256] {
            let d = WgmmaAtom::accumulator(n);
            let mut seen = HashSet::new();
            for t in 0..WARPGROUP_THREADS {
                for v in 0..d.values {
                    let (r, c) = d.coord(t, v);
                    assert!((0..64).contains(&r) && (0..n).contains(&c), "{t} {v}");
                    assert!(seen.insert((r, c)), "({r}, {c}) twice");
                }
            }
            assert_eq!(seen.len() as i64, 64 * n);
        }
        // Warp 1's lane 5 holds row 16 + 1, columns 2 and 3, then row 25.
        let d = WgmmaAtom::accumulator(64);
        assert_eq!(d.coord(32 + 5, 0), (17, 2));
        assert_eq!(d.coord(32 + 5, 1), (17, 3));
        assert_eq!(d.coord(32 + 5, 2), (25, 2));
        assert_eq!(d.coord(32 + 5, 4), (17, 10));
    }

    #[test]
    fn swizzles_follow_the_row_length() {
        let layout = |row_elements, swizzle| SharedTileLayout {
            rows: 64,
            row_elements,
            chunk_elements: 8,
            swizzle,
        };
        assert_eq!(Swizzle::of(&layout(64, true), 2), Some(Swizzle::B128));
        assert_eq!(Swizzle::of(&layout(32, true), 2), Some(Swizzle::B64));
        assert_eq!(Swizzle::of(&layout(16, true), 2), Some(Swizzle::B32));
        assert_eq!(Swizzle::of(&layout(128, true), 2), None);
        assert_eq!(Swizzle::of(&layout(128, false), 2), Some(Swizzle::None));
        // The 128B swizzle: chunk x of row r at chunk x ^ (r % 8).
        let l = layout(64, true);
        assert_eq!(l.offset(3, 8), 3 * 64 + (1 ^ 3) * 8);
    }
}
