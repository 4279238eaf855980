//! The shared-memory loads of the inner product: how many load instructions a thread
//! issues per reduction step, how wide they are, and how many wavefronts a warp's load
//! costs with bank conflicts.
//!
//! Each reduction step reads, per input, one float per register-tile position along the
//! axes that index the input. Lowering unrolls the register loops (and, within the
//! unroll limit, the inner and middle reduction loops), so within one straight-line body
//! every address is a runtime base plus a constant; NVRTC loads each distinct address
//! once and merges runs of consecutive addresses into 64- or 128-bit loads where the
//! address is provably aligned. The model reproduces that: it enumerates the constant
//! addresses of the body within the tile, and covers them in address order with
//! aligned groups of 4, else 2, else 1, where the runtime part's alignment is the gcd of
//! the tile offset and of everything a thread coordinate or a rolled loop variable
//! multiplies. Checked against NVRTC 13.0's sm_90 SASS for 72 sampled conv2d, matmul
//! and batch-matmul kernels: the static `LDS` count matched exactly for 65; the others
//! were within the compiler's own re-loads (e.g. `B_sh[k * 256 + t_n * 16 + o * 4 + i]`
//! is four `LDS.128`, `data_sh[c * 560 + p * 10 + t_q * 2 + i_q + ri_s]` scalar loads).
//!
//! Addresses go through the tile's layout strides (`SharedTile::strides`), so a
//! transposed or padded tile (`state::SharedLayout`) is modelled the same way; the
//! padded row length enters both the constant addresses and the runtime alignment.
//! Checked again after layouts were added, on 72 sampled states with a non-natural
//! layout (matmul 1024³, BERT-base 128x3072x768 and 128x768x768, batch matmul
//! 12x128x128x64, ResNet 3x3 conv at 14x14 and 56x56; NVRTC 13.0, sm_90, static `LDS`
//! count of the cubin from nvdisasm): the count matched exactly for 62, with the same
//! floats for 61; the others are within 20% — the compiler re-loading values, or
//! widening a load over an unused neighbour (a pad of 1 or 2 misaligns every other
//! row: `A_sh[k * 129 + ...]`). A 128x128x8 tile (16x16 threads, 2x4 registers per
//! axis) with the reduction loop rolled reads A as 8 scalar `LDS` per step in the
//! tensor's order and 2 `LDS.128` with `m` innermost (pad 0 or 4), as modelled; a
//! ResNet conv weight with `k` innermost likewise goes from 8 `LDS` to 2 `LDS.128`.
//!
//! Bank conflicts depend only on how the lanes' addresses differ, i.e. on the thread
//! coordinates: a register position or reduction step adds the same constant to every
//! lane, which permutes the banks and leaves the conflict degree unchanged. So the lanes
//! of a few warps are simulated at register position 0, step 0, once per load width.

use crate::geometry::Geometry;
use crate::indexing::Indexing;
use crate::sample::{R2, picks};
use crate::warp::{WARP_LANES, WarpAccess, wavefronts};
use schedule::task::AxisRef;

/// Warps whose lanes are simulated per input and state.
const WARP_SAMPLES: usize = 4;
/// Largest number of constant offsets (per dimension, and addresses per body)
/// enumerated; a valid state's unrolled body reads at most a few thousand.
const MAX_CONSTANTS: i64 = 1 << 16;
/// Largest tile (floats) whose addresses are kept as a bitset (227 KB is 58112).
const MAX_TILE_BITS: i64 = 1 << 22;
/// Load widths in floats: 32, 64 and 128 bits.
const WIDTHS: [i64; 3] = [1, 2, 4];

/// The inner product's loads of one input.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReadCost {
    /// Load instructions per thread per reduction step.
    pub loads_per_step: f64,
    /// Distinct floats loaded per thread per reduction step.
    pub floats_per_step: f64,
    /// Wavefronts per warp per reduction step (mean over the sampled warps).
    pub wavefronts_per_step: f64,
    /// Actual / conflict-free wavefronts (1 when nothing is loaded).
    pub conflict: f64,
}

/// Constant index values of one tensor dimension within a body: sorted distinct values,
/// or only their number when there are too many to enumerate.
enum Offsets {
    Listed(Vec<i64>),
    Counted(i64),
}

impl Offsets {
    fn len(&self) -> i64 {
        match self {
            Offsets::Listed(values) => values.len() as i64,
            Offsets::Counted(n) => *n,
        }
    }
}

/// Simulates the inner product's loads of input `input` of `geo`'s state.
pub(crate) fn read_cost(indexing: &Indexing, input: usize, geo: &Geometry, banks: u32) -> ReadCost {
    let tile = &geo.tiling.tiles[input];
    let strides = tile.strides();
    let rank = indexing.rank;
    let offsets: Vec<Offsets> = (0..rank)
        .map(|d| constant_offsets(&indexing.terms[d], geo, tile.shape[d]))
        .collect();
    // Alignment of the runtime part of every address (tile base, thread coordinates,
    // rolled reduction loops): a vector load may start only where it is aligned too.
    let mut align = tile.offset;
    for (d, terms) in indexing.terms.iter().enumerate() {
        for &(axis, coeff) in terms {
            for multiplier in runtime_multipliers(axis, geo) {
                align = gcd(align, coeff * multiplier * strides[d]);
            }
        }
    }
    let floats = offsets
        .iter()
        .fold(1i64, |acc, o| acc.saturating_mul(o.len()));
    let by_width = match body_addresses(&offsets, &strides, tile.allocated(), floats) {
        Some(addresses) => aligned_groups(&addresses, align),
        None => [floats, 0, 0],
    };
    let loads: i64 = by_width.iter().sum();

    // Lanes of the sampled warps at register position 0 and reduction step 0.
    let mut access = WarpAccess::new();
    let (mut body_actual, mut body_ideal) = (0.0, 0.0);
    let mut warps = 0u32;
    for warp in picks(geo.warps, WARP_SAMPLES, R2[0]) {
        warps += 1;
        access.clear();
        let first = warp * WARP_LANES as i64;
        let mut t = geo.thread_coords(first);
        for tid in first..(first + WARP_LANES as i64).min(geo.threads) {
            if tid > first {
                geo.next_thread(&mut t);
            }
            let mut address = tile.offset;
            for (d, terms) in indexing.terms.iter().enumerate() {
                for &(axis, coeff) in terms {
                    if let AxisRef::Spatial(a) = axis {
                        let s = &geo.state.spatial[a];
                        address += strides[d] * coeff * t[a] * i64::from(s.outer * s.inner);
                    }
                }
            }
            access.push(address);
        }
        for (width, &count) in WIDTHS.iter().zip(&by_width) {
            if count > 0 {
                let cost = wavefronts(&access, *width, banks);
                body_actual += f64::from(cost.actual) * count as f64;
                body_ideal += f64::from(cost.ideal) * count as f64;
            }
        }
    }
    let steps = geo.unrolled_steps.max(1) as f64;
    ReadCost {
        loads_per_step: loads as f64 / steps,
        floats_per_step: floats as f64 / steps,
        wavefronts_per_step: if warps == 0 {
            0.0
        } else {
            body_actual / f64::from(warps) / steps
        },
        conflict: if body_ideal == 0.0 {
            1.0
        } else {
            body_actual / body_ideal
        },
    }
}

/// Distinct constant values of one dimension's index within an unrolled body: the sum
/// over its terms of `coeff * local`, where a spatial axis's local index takes every
/// register position `v * thread * outer * inner + o * inner + i` (thread part 0) and a
/// reduction axis's takes `m * inner + i` over its unrolled loops.
fn constant_offsets(terms: &[(AxisRef, i64)], geo: &Geometry, extent: i64) -> Offsets {
    let combinations = terms.iter().fold(1i64, |acc, &(axis, _)| {
        acc.saturating_mul(constants_len(axis, geo))
    });
    if combinations > MAX_CONSTANTS {
        return Offsets::Counted(combinations.min(extent));
    }
    let mut values = vec![0i64];
    for &(axis, coeff) in terms {
        let list = local_constants(axis, geo);
        values = values
            .iter()
            .flat_map(|&v| list.iter().map(move |&x| v + coeff * x))
            .collect();
    }
    values.sort_unstable();
    values.dedup();
    Offsets::Listed(values)
}

/// How many constant values `local_constants` lists for an axis.
fn constants_len(axis: AxisRef, geo: &Geometry) -> i64 {
    let (middle, inner) = reduction_ranges(axis, geo);
    match axis {
        AxisRef::Spatial(a) => i64::from(geo.state.spatial[a].register_tile()),
        AxisRef::Reduction(_) => middle * inner,
    }
}

/// Values the middle and inner loop variables of a reduction axis take as constants
/// in one body (1: the loop is rolled, its variable is a runtime value).
fn reduction_ranges(axis: AxisRef, geo: &Geometry) -> (i64, i64) {
    match axis {
        AxisRef::Spatial(_) => (1, 1),
        AxisRef::Reduction(r) => {
            let split = &geo.state.reduction[r];
            let middle = if geo.unroll.middle {
                i64::from(split.middle)
            } else {
                1
            };
            let inner = if geo.unroll.inner {
                i64::from(split.inner)
            } else {
                1
            };
            (middle, inner)
        }
    }
}

/// The constant values an axis's local index takes within an unrolled body.
fn local_constants(axis: AxisRef, geo: &Geometry) -> Vec<i64> {
    match axis {
        AxisRef::Spatial(a) => {
            let s = &geo.state.spatial[a];
            let (v, t, o, i) = (
                i64::from(s.vthread),
                i64::from(s.thread),
                i64::from(s.outer),
                i64::from(s.inner),
            );
            let mut out = Vec::with_capacity((v * o * i) as usize);
            for vv in 0..v {
                for oo in 0..o {
                    for ii in 0..i {
                        out.push(vv * t * o * i + oo * i + ii);
                    }
                }
            }
            out
        }
        AxisRef::Reduction(r) => {
            let inner = i64::from(geo.state.reduction[r].inner);
            let (middle_range, inner_range) = reduction_ranges(axis, geo);
            let mut out = Vec::with_capacity((middle_range * inner_range) as usize);
            for m in 0..middle_range {
                for i in 0..inner_range {
                    out.push(m * inner + i);
                }
            }
            out
        }
    }
}

/// What a runtime variable multiplies in an axis's local index: the thread coordinate
/// of a spatial axis, the rolled middle and inner loop variables of a reduction axis.
fn runtime_multipliers(axis: AxisRef, geo: &Geometry) -> [i64; 2] {
    match axis {
        AxisRef::Spatial(a) => {
            let s = &geo.state.spatial[a];
            let thread = if s.thread > 1 {
                i64::from(s.outer * s.inner)
            } else {
                0
            };
            [thread, 0]
        }
        AxisRef::Reduction(r) => {
            let split = &geo.state.reduction[r];
            let middle = if split.middle > 1 && !geo.unroll.middle {
                i64::from(split.inner)
            } else {
                0
            };
            let inner = i64::from(split.inner > 1 && !geo.unroll.inner);
            [middle, inner]
        }
    }
}

/// The constant part of every address the body reads, within the tile, as a bitset:
/// the sums over dimensions of stride x constant offset. None when there are too many
/// to enumerate (only for absurd states).
fn body_addresses(
    offsets: &[Offsets],
    strides: &[i64],
    elements: i64,
    floats: i64,
) -> Option<Vec<u64>> {
    if floats > MAX_CONSTANTS || elements > MAX_TILE_BITS {
        return None;
    }
    let lists: Vec<&[i64]> = offsets
        .iter()
        .map(|o| match o {
            Offsets::Listed(values) => Some(values.as_slice()),
            Offsets::Counted(_) => None,
        })
        .collect::<Option<_>>()?;
    let mut bits = vec![0u64; (elements as usize).div_ceil(64)];
    let mut sums = vec![0i64];
    for (list, &stride) in lists.iter().zip(strides) {
        sums = sums
            .iter()
            .flat_map(|&s| list.iter().map(move |&x| s + x * stride))
            .collect();
    }
    for address in sums {
        if (0..elements).contains(&address) {
            bits[address as usize / 64] |= 1 << (address % 64);
        }
    }
    Some(bits)
}

/// Loads per width (1, 2, 4 floats) covering the addresses set in `bits`: greedily, in
/// address order, a 128-bit load where four consecutive addresses start at a multiple
/// of 4 and the runtime base is 4-aligned, else a 64-bit one likewise, else a scalar.
fn aligned_groups(bits: &[u64], align: i64) -> [i64; 3] {
    let end = bits.len() * 64;
    let set = |x: usize| x < end && (bits[x / 64] >> (x % 64)) & 1 == 1;
    let mut counts = [0; 3];
    let mut x = 0;
    while x < end {
        // Jump to the next set bit.
        let rest = bits[x / 64] >> (x % 64);
        if rest == 0 {
            x = (x / 64 + 1) * 64;
            continue;
        }
        x += rest.trailing_zeros() as usize;
        let run = |w: usize| align % w as i64 == 0 && x % w == 0 && (1..w).all(|k| set(x + k));
        let (slot, w) = if run(4) {
            (2, 4)
        } else if run(2) {
            (1, 2)
        } else {
            (0, 1)
        };
        counts[slot] += 1;
        x += w;
    }
    counts
}

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitset(addresses: impl IntoIterator<Item = usize>) -> Vec<u64> {
        let mut bits = vec![0u64; 4];
        for a in addresses {
            bits[a / 64] |= 1 << (a % 64);
        }
        bits
    }

    #[test]
    fn groups_need_alignment_of_base_and_offset() {
        assert_eq!(aligned_groups(&bitset(0..16), 8), [0, 0, 4]);
        assert_eq!(aligned_groups(&bitset(0..16), 2), [0, 8, 0]);
        assert_eq!(aligned_groups(&bitset(0..16), 1), [16, 0, 0]);
        // 1..9: a scalar, a pair at 2, a quad at 4, a scalar at 8.
        assert_eq!(aligned_groups(&bitset(1..9), 4), [2, 1, 1]);
        // Gaps: 0, 1, 4, 5 are two pairs; runs may cross a word boundary.
        assert_eq!(aligned_groups(&bitset([0, 1, 4, 5]), 4), [0, 2, 0]);
        assert_eq!(aligned_groups(&bitset(60..68), 4), [0, 0, 2]);
        assert_eq!(aligned_groups(&bitset([]), 4), [0, 0, 0]);
    }

    #[test]
    fn gcd_of_zero_is_the_other() {
        assert_eq!(gcd(0, 12), 12);
        assert_eq!(gcd(8, 12), 4);
        assert_eq!(gcd(0, 0), 0);
    }
}
