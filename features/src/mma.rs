//! Features of tensor-core states (`State::mma`): the `cp.async` fill of each K tile,
//! the `ldmatrix` fragment reads, the epilogue's stores, the `mma.sync` and fragment-load
//! counts and the pipeline, with occupancy and waves under the same rules as the
//! CUDA-core sketch's (`extract`).
//!
//! The kernel modelled is the one the tensor-core sketch generates: a grid of
//! `split_k x batch x ceil(M / block_m) x ceil(N / block_n)` blocks; per K tile, copy
//! `v = round * threads + threadIdx.x` of an input's tile covers elements
//! `[v * vector, (v + 1) * vector)` of the tile's logical rows in row-major order (A's
//! rows are M, B's are N when it is K-major and K when it is N-major), read at the
//! address the contraction's affine indexing gives and written at
//! `SharedTileLayout::offset`. Copies of padding and tails are zero-filled (`cp.async`
//! with a source size of 0); they are counted as fetched, at the address the indexing
//! points at, so that the count is a property of the instruction stream and an upper
//! bound of the traffic. Per k-step each warp reads its A fragments with one
//! `ldmatrix.x4` per 16-row MMA tile and its B fragments with one `ldmatrix.x4` per two
//! 8-column tiles (`.trans` when B is N-major; TF32 with an N-major B uses two 32-bit
//! shared loads per tile instead), and issues `tiles_m x tiles_n` `mma.sync`. The
//! epilogue stores each MMA tile's four accumulators per thread as two 2-element
//! stores, rows 8 apart; tails are predicated off. Under split-K each block first
//! stores its f32 partial sums (or adds them atomically into its tile's) and the last
//! warps of a tile read them back.
//!
//! The instruction counts (`mma.sync`, fragment loads, `cp.async` copies) follow from
//! the tiling and the atoms here rather than from lowering each state, which would
//! almost triple an extraction's cost (lowering a 1024³ fp16 state takes 34.5 µs, its
//! extraction 19.5, on the CPU host) and is not defined for the invalid states the
//! search also scores; a test holds them to the census of the kernel lowering generates
//! (`schedule::census`, `tests/tensor_core.rs`), so a change to the lowering that the
//! features do not follow fails there.
//!
//! As for the CUDA-core fetch, a few warp instructions at low-discrepancy (block, K
//! tile) points stand for the whole fill and epilogue (`sample`). The `ldmatrix` bank
//! conflicts need no sampling: every 8x8 matrix a block reads is 8 consecutive rows
//! (from a multiple of 8) of one 16-byte chunk column of the tile, and each (row
//! group, chunk) pair is read equally often, so their mean over the tile is the exact
//! conflict degree.

use crate::common::{
    fill_occupancy, fill_registers, flag, log2_1p, ratio, split_traffic, stream_traffic,
};
use crate::fetch::{FetchCost, InstructionCost, Weighted, ratio_or_one, summarize};
use crate::geometry::{Coords, MAX_AXES};
use crate::sample::{R2, R3, scattered, warp_instructions};
use crate::table::FeatureRow;
use crate::warp::{Cost, WARP_LANES, WarpAccess, wavefronts};
use schedule::atom::copy::MATRIX_ROWS;
use schedule::atom::mma::{C_M16N8, TF32_M16N8K8};
use schedule::atom::{CHUNK_BYTES, Ldmatrix, MmaAtom, SharedTileLayout, SpanLayout};
use schedule::gemm::GemmView;
use schedule::row_span::COPY_ELEMENTS;
use schedule::sketch::mma_sync::{MmaTiling, SpanStaging};
use schedule::task::{Access, AxisRef, Contraction};
use schedule::validate::validate;
use schedule::{DType, GpuSpec, State};

/// Bounds of the tiling fields that are described at all. Validation accepts far less
/// (at most 8 warps, 8 k-steps, 8 stages, a split of 64, 16-byte copies and a block
/// tile within shared memory), so a state beyond them is invalid anyway; within them
/// no count below overflows, and the schedule crate's u32 arithmetic on the tiling
/// (threads, accumulators, shared bytes) cannot either.
const MAX_WARPS_PER_AXIS: u32 = 32;
const MAX_BLOCK: u32 = 1 << 16;
const MAX_STEPS: u32 = 64;
const MAX_VECTOR: u32 = 64;
const MAX_SPLIT: u32 = 1 << 16;

/// Warp instructions simulated per input's fill and for the epilogue.
const COPY_SAMPLES: usize = 12;
const STORE_SAMPLES: usize = 8;
/// Row groups and chunk columns of a tile whose ldmatrix matrices are simulated: the
/// swizzle and the bank groups repeat every 8 rows and every 8 chunks, so these cover
/// every distinct pattern.
const LDMATRIX_ROW_GROUPS: i64 = 4;
const LDMATRIX_CHUNKS: i64 = 16;
const SECTOR_BYTES: i64 = crate::common::SECTOR_BYTES as i64;
const WAVEFRONT_BYTES: f64 = 128.0;

/// A tensor's flat element offset as a linear function of the axis values: the
/// affine indexing through the row-major strides, without bounds (an index outside the
/// tensor, padding or a tail, gives the address the indexing points at, which is where
/// a predicated copy's footprint is counted).
#[derive(Debug, Clone, Default)]
struct Linear {
    base: i64,
    spatial: Coords,
    reduction: Coords,
}

impl Linear {
    fn of(access: &Access) -> Self {
        let mut linear = Linear::default();
        for (index, stride) in access.index.iter().zip(access.strides()) {
            linear.base += index.offset * stride;
            for &(axis, coeff) in &index.terms {
                match axis {
                    AxisRef::Spatial(a) => linear.spatial[a] += coeff * stride,
                    AxisRef::Reduction(r) => linear.reduction[r] += coeff * stride,
                }
            }
        }
        linear
    }

    /// The offset's part from `linear` laid over `axes` (last fastest) with weights
    /// `weights`; the outermost axis takes whatever does not fit (a tail carries on
    /// past its extent, as the unpredicated address would).
    fn part(axes: &[(usize, i64)], weights: &Coords, mut linear: i64) -> i64 {
        let mut offset = 0;
        for (i, &(axis, extent)) in axes.iter().enumerate().rev() {
            let value = if i == 0 { linear } else { linear % extent };
            offset += value * weights[axis];
            linear /= extent;
        }
        offset
    }
}

/// The task as the tensor-core features need it, computed once per task: its GEMM view
/// and how GEMM coordinates map to input and output offsets.
#[derive(Debug, Clone)]
pub(crate) struct MmaTask {
    view: GemmView,
    /// (spatial axis, extent) of the rows, the columns and the batch, in axis order.
    m_axes: Vec<(usize, i64)>,
    n_axes: Vec<(usize, i64)>,
    batch_axes: Vec<(usize, i64)>,
    /// (reduction axis, extent), in axis order (the last one fastest in K).
    k_axes: Vec<(usize, i64)>,
    inputs: [Linear; 2],
    output: Linear,
    element_bytes: i64,
    output_bytes: i64,
    /// Compulsory global bytes at the task's element sizes.
    ideal_global_bytes: f64,
}

impl MmaTask {
    /// None when the contraction has no GEMM view (the tensor-core sketch cannot tile
    /// it) or more axes than the simulations handle.
    pub(crate) fn new(c: &Contraction, touched_inputs: f64, bias_elements: f64) -> Option<Self> {
        if c.spatial.len() > MAX_AXES || c.reduction.len() > MAX_AXES {
            return None;
        }
        let view = GemmView::of(c).ok()?;
        // Extents are at least 1 (a task's axes are), so the divisions in `part` are safe.
        let spatial = |axes: &[usize]| -> Vec<(usize, i64)> {
            axes.iter()
                .map(|&a| (a, i64::from(c.spatial[a].extent.max(1))))
                .collect()
        };
        let mut output = Linear::default();
        for (w, stride) in output.spatial.iter_mut().zip(c.output_strides()) {
            *w = stride;
        }
        let element_bytes = i64::from(c.dtype.bytes());
        let output_bytes = i64::from(c.out_dtype.bytes());
        Some(MmaTask {
            m_axes: spatial(&view.m_axes),
            n_axes: spatial(&view.n_axes),
            batch_axes: spatial(&view.batch_axes),
            k_axes: c
                .reduction
                .iter()
                .enumerate()
                .map(|(r, axis)| (r, i64::from(axis.extent.max(1))))
                .collect(),
            inputs: [Linear::of(&c.inputs[0]), Linear::of(&c.inputs[1])],
            output,
            element_bytes,
            output_bytes,
            ideal_global_bytes: (touched_inputs + bias_elements) * element_bytes as f64
                + c.output_elements() as f64 * output_bytes as f64,
            view,
        })
    }

    /// Compulsory global bytes at the task's element sizes.
    pub(crate) fn ideal_global_bytes(&self) -> f64 {
        self.ideal_global_bytes
    }

    /// Element offset in input `input` of its GEMM element (batch, row or column,
    /// k): `mn` is the row `m` for A, the column `n` for B.
    fn input_offset(&self, input: usize, batch: i64, mn: i64, k: i64) -> i64 {
        let linear = &self.inputs[input];
        let mn_axes = if input == 0 {
            &self.m_axes
        } else {
            &self.n_axes
        };
        linear.base
            + Linear::part(&self.batch_axes, &linear.spatial, batch)
            + Linear::part(mn_axes, &linear.spatial, mn)
            + Linear::part(&self.k_axes, &linear.reduction, k)
    }

    /// Element offset of output element (batch, m, n).
    fn output_offset(&self, batch: i64, m: i64, n: i64) -> i64 {
        let weights = &self.output.spatial;
        Linear::part(&self.batch_axes, weights, batch)
            + Linear::part(&self.m_axes, weights, m)
            + Linear::part(&self.n_axes, weights, n)
    }
}

/// `ceil(a / b)` for `a >= 0` (and `b` taken as at least 1).
fn ceil_div(a: i64, b: i64) -> i64 {
    let b = b.max(1);
    (a + b - 1) / b
}

/// Whether the features can describe `t` (see the bounds above).
fn describable(t: &MmaTiling, split_k: u32) -> bool {
    (1..=MAX_WARPS_PER_AXIS).contains(&t.warps_m)
        && (1..=MAX_WARPS_PER_AXIS).contains(&t.warps_n)
        && (1..=MAX_BLOCK).contains(&t.block_m)
        && (1..=MAX_BLOCK).contains(&t.block_n)
        && (1..=MAX_STEPS).contains(&t.k_steps)
        && (1..=MAX_STEPS).contains(&t.stages)
        && t.vector.iter().all(|v| (1..=MAX_VECTOR).contains(v))
        && (1..=MAX_SPLIT).contains(&split_k)
}

/// The grid of a state: output tiles, K tiles, and how a linear block index splits.
struct Grid {
    block_m: i64,
    block_n: i64,
    block_k: i64,
    tiles_n: i64,
    /// Output tiles of one batch element.
    tiles_mn: i64,
    /// Output tiles (blocks of one reduction split) and K tiles of the whole reduction.
    tiles: i64,
    ktiles: i64,
}

impl Grid {
    fn new(view: &GemmView, t: &MmaTiling, dtype: DType, span: Option<&SpanStaging>) -> Self {
        let block_m = i64::from(t.block_m);
        let block_n = i64::from(t.block_n);
        let block_k = t.block_k(dtype) as i64;
        let ktiles = t.ktiles(view, dtype, span) as i64;
        let view = &MmaTiling::tiled_view(view, span);
        let tiles_m = ceil_div(view.m as i64, block_m);
        let tiles_n = ceil_div(view.n as i64, block_n);
        Grid {
            block_m,
            block_n,
            block_k,
            tiles_n,
            tiles_mn: tiles_m * tiles_n,
            tiles: view.batch as i64 * tiles_m * tiles_n,
            ktiles,
        }
    }

    /// (batch, first row, first column) of output tile `block`.
    fn origin(&self, block: i64) -> (i64, i64, i64) {
        let batch = block / self.tiles_mn.max(1);
        let within = block % self.tiles_mn.max(1);
        let (tm, tn) = (within / self.tiles_n.max(1), within % self.tiles_n.max(1));
        (batch, tm * self.block_m, tn * self.block_n)
    }
}

/// One input's fill of a K tile, as the warp instructions `round * warps + warp`.
struct Fill<'a> {
    task: &'a MmaTask,
    grid: &'a Grid,
    input: usize,
    layout: SharedTileLayout,
    vector: i64,
    copies_per_row: i64,
    copies: i64,
    threads: i64,
    warps: i64,
    rounds: i64,
    banks: u32,
}

impl<'a> Fill<'a> {
    fn new(
        task: &'a MmaTask,
        grid: &'a Grid,
        t: &MmaTiling,
        input: usize,
        dtype: DType,
        banks: u32,
    ) -> Self {
        let layout = t.tile_layout(input, &task.view, dtype);
        let vector = i64::from(t.vector[input]);
        let copies_per_row = ceil_div(layout.row_elements, vector);
        let copies = layout.rows * copies_per_row;
        let threads = i64::from(t.threads());
        Fill {
            task,
            grid,
            input,
            layout,
            vector,
            copies_per_row,
            copies,
            threads,
            warps: threads / WARP_LANES as i64,
            rounds: ceil_div(copies, threads),
            banks,
        }
    }

    /// The global sectors and shared wavefronts of instruction `j` in output tile
    /// `block` and K tile `ktile` (None when no lane copies).
    fn instruction(&self, j: i64, block: i64, ktile: i64) -> Option<InstructionCost> {
        let (round, warp) = (j / self.warps.max(1), j % self.warps.max(1));
        let first = round * self.threads + warp * WARP_LANES as i64;
        let active = (self.copies - first).clamp(0, WARP_LANES as i64);
        if active == 0 {
            return None;
        }
        let (batch, m0, n0) = self.grid.origin(block);
        let k0 = ktile * self.grid.block_k;
        let bytes = self.task.element_bytes;
        let copy_bytes = self.vector * bytes;
        let mut global = Sectors::default();
        let mut shared = WarpAccess::new();
        let mn0 = if self.input == 0 { m0 } else { n0 };
        for v in first..first + active {
            let row = v / self.copies_per_row;
            let column = (v % self.copies_per_row) * self.vector;
            let (mn, k) = if self.input == 1 && !self.task.view.b_k_major {
                (mn0 + column, k0 + row)
            } else {
                (mn0 + row, k0 + column)
            };
            let offset = self.task.input_offset(self.input, batch, mn, k);
            global.push(offset * bytes, copy_bytes);
            // Shared memory in 4-byte words; a 2-byte copy shares its word with the
            // neighbouring lane's, which the bank serves together.
            shared.push(self.layout.offset(row, column) * bytes / 4);
        }
        let load = Cost {
            actual: global.distinct(),
            ideal: ceil_div(active * copy_bytes, SECTOR_BYTES) as u32,
        };
        let store = wavefronts(&shared, (copy_bytes / 4).max(1), self.banks);
        Some((Some(load), store))
    }

    /// Sectors and store wavefronts per block and K tile, from a sample of the block's
    /// instructions at scattered (output tile, K tile) points.
    fn cost(&self) -> FetchCost {
        let grid = self.grid;
        let sampled = warp_instructions(self.rounds, self.threads, COPY_SAMPLES, R3[0])
            .enumerate()
            .map(|(k, (j, weight))| {
                let block = scattered(k, grid.tiles, R3[1]);
                let ktile = scattered(k, grid.ktiles, R3[2]);
                (self.instruction(j, block, ktile), weight)
            });
        summarize(sampled)
    }
}

/// The distinct 32-byte sectors of one warp instruction's lanes.
struct Sectors {
    /// First and last sector of each lane (an aligned copy has one).
    buf: [i64; 2 * WARP_LANES],
    len: usize,
}

impl Default for Sectors {
    fn default() -> Self {
        Sectors {
            buf: [0; 2 * WARP_LANES],
            len: 0,
        }
    }
}

impl Sectors {
    /// Adds a lane accessing `len` bytes from byte `start` (counted as at most 32: a
    /// copy of a valid state is at most 16 bytes, aligned, in one sector).
    fn push(&mut self, start: i64, len: i64) {
        let first = start.div_euclid(SECTOR_BYTES);
        let last = (start + len.clamp(1, SECTOR_BYTES) - 1).div_euclid(SECTOR_BYTES);
        if self.len + 2 > self.buf.len() {
            return;
        }
        self.buf[self.len] = first;
        self.len += 1;
        if last != first {
            self.buf[self.len] = last;
            self.len += 1;
        }
    }

    fn distinct(&mut self) -> u32 {
        let sectors = &mut self.buf[..self.len];
        if !sectors.is_sorted() {
            sectors.sort_unstable();
        }
        let mut distinct = u32::from(!sectors.is_empty());
        for i in 1..sectors.len() {
            distinct += u32::from(sectors[i] != sectors[i - 1]);
        }
        distinct
    }
}

/// Mean wavefronts of one ldmatrix 8x8 matrix of `layout` (its ideal is 1): the eight
/// 16-byte row addresses of one phase, each in one 16-byte bank group, cost as many
/// wavefronts as the most rows (at distinct addresses) in one group.
fn ldmatrix_conflict(layout: &SharedTileLayout, element_bytes: i64, banks: u32) -> f64 {
    let groups = (i64::from(banks) * 4 / i64::from(CHUNK_BYTES)).clamp(1, 64);
    let row_groups = (layout.rows / MATRIX_ROWS).clamp(1, LDMATRIX_ROW_GROUPS);
    let chunks = layout.chunks().clamp(1, LDMATRIX_CHUNKS);
    let (mut total, mut matrices) = (0.0, 0.0);
    for g in 0..row_groups {
        for x in 0..chunks {
            let mut rows = [0i64; MATRIX_ROWS as usize];
            for (i, r) in rows.iter_mut().enumerate() {
                let offset = layout.offset(g * MATRIX_ROWS + i as i64, x * layout.chunk_elements);
                *r = offset * element_bytes / i64::from(CHUNK_BYTES);
            }
            rows.sort_unstable();
            let mut per_group = [0u32; 64];
            for (i, &chunk) in rows.iter().enumerate() {
                if i == 0 || chunk != rows[i - 1] {
                    per_group[chunk.rem_euclid(groups) as usize] += 1;
                }
            }
            total += f64::from(per_group.iter().copied().max().unwrap_or(1));
            matrices += 1.0;
        }
    }
    total / matrices
}

/// Mean wavefronts of the 32-bit shared loads of a TF32 fragment from an N-major B tile
/// (ideal 1): each lane reads its values of the TF32 B fragment (`atom::mma`).
fn lds32_conflict(layout: &SharedTileLayout, banks: u32) -> f64 {
    let b = TF32_M16N8K8.b;
    let n_tiles = (layout.row_elements / 8).clamp(1, LDMATRIX_CHUNKS);
    let k_steps = (layout.rows / 8).clamp(1, LDMATRIX_ROW_GROUPS);
    let (mut total, mut loads) = (0.0, 0.0);
    let mut access = WarpAccess::new();
    for j in 0..n_tiles {
        for step in 0..k_steps {
            for value in 0..b.values {
                access.clear();
                for lane in 0..WARP_LANES as i64 {
                    let (k, n) = b.coord(lane, value);
                    access.push(layout.offset(8 * step + k, 8 * j + n));
                }
                total += f64::from(wavefronts(&access, 1, banks).actual);
                loads += 1.0;
            }
        }
    }
    total / loads
}

/// Mean wavefronts of a row-span A fragment's 32-bit loads (ideal 1): each lane reads
/// the pair of its register's values (`atom::mma`'s A layout) from the runs.
fn span_lds_conflict(layout: &SpanLayout, dtype: DType, banks: u32) -> f64 {
    let atom = MmaAtom::sizing(dtype);
    let mut access = WarpAccess::new();
    let (mut total, mut loads) = (0.0, 0.0);
    for value in (0..atom.a.values).step_by(2) {
        access.clear();
        for lane in 0..WARP_LANES as i64 {
            let (row, k) = atom.a.coord(lane, value);
            access.push(layout.offset(row, k) / 2);
        }
        total += f64::from(wavefronts(&access, 1, banks).actual);
        loads += 1.0;
    }
    total / loads
}

/// Row spans' fill, per block and K tile: A's runs in 16-byte copies, each group's run
/// contiguous (its sectors, each a 16-byte aligned half at the ends); the held weights,
/// read once per block element by element (each held channel's filter rows contiguous),
/// spread over the block's `block_ktiles` K tiles. Rounds per input and the costs.
fn span_fetch(
    s: &SpanStaging,
    t: &MmaTiling,
    dtype: DType,
    block_ktiles: f64,
) -> ([f64; 2], [FetchCost; 2]) {
    let threads = f64::from(t.threads());
    let bytes = f64::from(dtype.bytes());
    let sector = SECTOR_BYTES as f64;
    let copies = (s.a.elements() / COPY_ELEMENTS) as f64;
    let group_bytes = s.a.group_elements as f64 * bytes;
    let a_sectors = s.a.groups as f64 * (group_bytes / sector).ceil();
    let a_instructions = (copies / 32.0).ceil().max(1.0);
    let a = FetchCost {
        sectors_per_stage: a_sectors,
        sectors_per_instruction: a_sectors / a_instructions,
        coalescing: ratio_or_one(copies * 16.0 / sector, a_sectors),
        store_wavefronts_per_stage: copies * 16.0 / WAVEFRONT_BYTES,
        store_conflict: 1.0,
    };
    let held = s.held_rows as f64 * f64::from(t.block_n) * t.block_k(dtype) as f64;
    let taps = s.held_rows as f64 * f64::from(t.block_n) * s.span.taps as f64;
    let b_sectors = (taps * bytes / sector).ceil();
    let b_instructions = (held / 32.0).ceil().max(1.0);
    let per_stage = |x: f64| x / block_ktiles.max(1.0);
    let b = FetchCost {
        sectors_per_stage: per_stage(b_sectors),
        sectors_per_instruction: b_sectors / b_instructions,
        coalescing: ratio_or_one(taps * bytes / sector, b_sectors),
        store_wavefronts_per_stage: per_stage(b_instructions),
        store_conflict: 1.0,
    };
    ([(copies / threads).ceil(), (held / threads).ceil()], [a, b])
}

/// The epilogue per tile: sectors of the output's stores.
struct Epilogue {
    sectors_per_block: f64,
    sectors_per_instruction: f64,
    coalescing: f64,
}

/// Simulates a sample of the epilogue's store instructions: per warp, MMA tile and row
/// half, each lane stores its two consecutive accumulators of that half (`atom::mma`'s
/// C fragment: row `l / 4 (+ 8)`, column `2 * (l % 4)` of the 16 x 8 tile).
fn epilogue(task: &MmaTask, grid: &Grid, t: &MmaTiling) -> Epilogue {
    use schedule::atom::mma::{M as MMA_M, N as MMA_N};
    let (tiles_m, tiles_n) = (i64::from(t.tiles_m()), i64::from(t.tiles_n()));
    let per_warp = tiles_m * tiles_n * 2;
    let instructions = i64::from(t.warps_m * t.warps_n) * per_warp;
    let (warp_m, warp_n) = (i64::from(t.warp_m()), i64::from(t.warp_n()));
    let bytes = task.output_bytes;
    let (m, n) = (task.view.m as i64, task.view.n as i64);
    let mut total = Weighted::default();
    let mut storing = 0.0;
    let samples = STORE_SAMPLES.min(instructions.max(0) as usize);
    let weight = if samples == 0 {
        0.0
    } else {
        instructions as f64 / samples as f64
    };
    for k in 0..samples {
        let (batch, m0, n0) = grid.origin(scattered(k, grid.tiles, R2[0]));
        let j = scattered(k, instructions, R2[1]);
        let (warp, within) = (j / per_warp, j % per_warp);
        let (wm, wn) = (warp / i64::from(t.warps_n), warp % i64::from(t.warps_n));
        let (tile, half) = (within / 2, within % 2);
        let (tm, tn) = (tile / tiles_n.max(1), tile % tiles_n.max(1));
        let mut sectors = Sectors::default();
        let mut active = 0;
        for lane in 0..WARP_LANES as i64 {
            // The first of the two accumulators of this row half.
            let (r, c) = C_M16N8.coord(lane, 2 * half);
            let row = m0 + wm * warp_m + tm * MMA_M + r;
            let column = n0 + wn * warp_n + tn * MMA_N + c;
            if row < m && column < n {
                active += 1;
                let offset = task.output_offset(batch, row, column);
                sectors.push(offset * bytes, 2 * bytes);
            }
        }
        if active > 0 {
            storing += weight;
            let cost = Cost {
                actual: sectors.distinct(),
                ideal: ceil_div(active * 2 * bytes, SECTOR_BYTES) as u32,
            };
            total.add(cost, weight);
        }
    }
    Epilogue {
        sectors_per_block: total.actual,
        sectors_per_instruction: ratio(total.actual, storing),
        coalescing: ratio_or_one(total.ideal, total.actual),
    }
}

/// Fills the row of tensor-core state `state` (whose `mma` is `t`) of the task with
/// contraction `c` on `gpu`, seen as `task` (None: no GEMM view); `row` comes holding
/// the task's features.
pub(crate) fn fill(
    row: &mut FeatureRow,
    c: &Contraction,
    gpu: &GpuSpec,
    task: Option<&MmaTask>,
    state: &State,
    t: &MmaTiling,
) {
    row.sketch = 1.0;
    if !describable(t, state.split_k) {
        // Beyond every bound validation accepts: invalid, and nothing else to say.
        return;
    }
    // Task-level values, which nothing below changes.
    let task_flops = row.task_flops;
    let dtype = c.dtype;
    let element_bytes = i64::from(dtype.bytes());
    let e = element_bytes as f64;
    row.valid = flag(validate(c, state, gpu).is_ok());

    // Raw tiling.
    let threads = t.threads();
    let warps = f64::from(t.warps_m * t.warps_n);
    let (tiles_m, tiles_n) = (f64::from(t.tiles_m()), f64::from(t.tiles_n()));
    let k_steps = f64::from(t.k_steps);
    row.mma_block_m = f64::from(t.block_m);
    row.mma_block_n = f64::from(t.block_n);
    row.mma_warps_m = f64::from(t.warps_m);
    row.mma_warps_n = f64::from(t.warps_n);
    row.mma_warp_m = f64::from(t.warp_m());
    row.mma_warp_n = f64::from(t.warp_n());
    row.mma_tiles_m = tiles_m;
    row.mma_tiles_n = tiles_n;
    row.mma_k_steps = k_steps;
    row.mma_block_k = t.block_k(dtype) as f64;
    row.mma_input_vector = f64::from(t.vector[0]);
    row.mma_weight_vector = f64::from(t.vector[1]);
    row.mma_input_copy_bytes = f64::from(t.vector[0]) * e;
    row.mma_weight_copy_bytes = f64::from(t.vector[1]) * e;
    row.mma_swizzle = flag(t.swizzle);
    row.mma_stages = f64::from(t.stages);
    let span = t.span_staging(c, state.split_k).ok().flatten();
    row.mma_row_span = flag(span.is_some());
    row.mma_stage_bytes = match &span {
        // A stage's runs; the held weights come once per block.
        Some(s) => (s.a.elements() * element_bytes) as f64,
        None => t.shared_bytes(dtype, None) as f64 / f64::from(t.stages),
    };
    row.split_k = f64::from(state.split_k);
    row.threads_per_block = f64::from(threads);
    row.warps_per_block = warps;
    row.block_tile_elements = f64::from(t.block_m) * f64::from(t.block_n);
    let shared_bytes = t.shared_bytes(dtype, span.as_ref());
    row.shared_bytes_per_block = shared_bytes as f64;
    let allocated = fill_registers(gpu, row, t.register_estimate(), u64::from(threads));

    let Some(task) = task else {
        // No GEMM view (NCHW conv2d): no grid to describe; the state is invalid.
        return;
    };
    let view = &task.view;
    row.mma_weight_n_major = flag(!view.b_k_major);
    let grid = Grid::new(view, t, dtype, span.as_ref());
    let split_k = i64::from(state.split_k);
    // A persistent block works through several tiles in turn; a stream-K block
    // through its run of K tiles (the longest), as one unit.
    let stream = (t.stream_k > 0).then(|| t.stream(view, dtype));
    let tiled = MmaTiling::tiled_view(view, span.as_ref());
    let grid_blocks = t.grid_blocks(&tiled, state.split_k) as i64;
    let tiles_per_block = match t.persistent {
        0 => 1,
        _ => ceil_div(grid.tiles, grid_blocks),
    };
    row.mma_persistent = t.persistent as f64;
    row.mma_stream_k = t.stream_k as f64;
    let ktiles_per_block = match &stream {
        Some(s) => s.longest() as i64,
        None => ceil_div(grid.ktiles, split_k) * tiles_per_block,
    };
    // Per-block values follow one block over its chunk of the K tiles (the longest
    // under split-K) of each of its tiles; totals count each (output tile, K tile) once.
    let block_ktiles = ktiles_per_block as f64;
    let tile_ktiles = grid.tiles as f64 * grid.ktiles as f64;
    row.thread_blocks = grid_blocks as f64;
    row.reduction_stages = block_ktiles;
    row.mma_ktiles = grid.ktiles as f64;
    let prologue =
        (i64::from(t.stages) - 1).min(ktiles_per_block / tiles_per_block) * tiles_per_block;
    row.mma_prologue_tiles = prologue as f64;
    row.mma_pipeline_fill = ratio(prologue as f64, block_ktiles);
    let executed = tile_ktiles * row.block_tile_elements * grid.block_k as f64;
    row.work_efficiency = ratio(task_flops / 2.0, executed);

    // MMA and fragment loads per block and K tile.
    let mma_per_ktile = warps * tiles_m * tiles_n * k_steps;
    let a_loads = warps * tiles_m * k_steps;
    let a_matrices = Ldmatrix::A.matrices as f64 * a_loads;
    let (a_matrices, a_conflict) = match &span {
        // Four 32-bit loads per 16-row fragment instead of one ldmatrix.x4.
        Some(s) => (
            a_loads * MmaAtom::sizing(dtype).a_registers as f64,
            span_lds_conflict(&s.a, dtype, gpu.shared_banks),
        ),
        None => (
            a_matrices,
            ldmatrix_conflict(
                &t.tile_layout(0, view, dtype),
                element_bytes,
                gpu.shared_banks,
            ),
        ),
    };
    let b_layout = t.tile_layout(1, view, dtype);
    let (b_loads, b_conflict, b_wavefronts) = if dtype.bytes() == 4 && !view.b_k_major {
        // One 32-bit load per register of each 8-column tile's fragment.
        let loads = warps * k_steps * TF32_M16N8K8.b_registers as f64 * tiles_n;
        let conflict = lds32_conflict(&b_layout, gpu.shared_banks);
        (loads, conflict, loads * conflict)
    } else {
        let loads = warps * k_steps * (tiles_n / 2.0).ceil();
        let matrices = warps * k_steps * Ldmatrix::B_K_MAJOR.matrices as f64 * tiles_n;
        let conflict = ldmatrix_conflict(&b_layout, element_bytes, gpu.shared_banks);
        (loads, conflict, matrices * conflict)
    };
    let a_wavefronts = a_matrices * a_conflict;
    // A per ldmatrix.x4; B per 8-column tile and k-step: its n × k elements.
    let atom = MmaAtom::sizing(dtype);
    let b_fragment_bytes = (atom.n * atom.k * element_bytes) as f64;
    let fragment_bytes =
        a_loads * Ldmatrix::A.bytes() as f64 + warps * k_steps * tiles_n * b_fragment_bytes;
    row.mma_per_block = mma_per_ktile * block_ktiles;
    row.mma_instructions = mma_per_ktile * tile_ktiles;
    row.mma_input_ldmatrix_per_block = a_loads * block_ktiles;
    row.mma_weight_ldmatrix_per_block = b_loads * block_ktiles;
    row.mma_ldmatrix_bytes_per_block = fragment_bytes * block_ktiles;
    row.mma_per_ldmatrix = ratio(mma_per_ktile, a_loads + b_loads);
    row.input_bank_conflict = a_conflict;
    row.weight_bank_conflict = b_conflict;
    row.input_shared_load_wavefronts = a_wavefronts * tile_ktiles;
    row.weight_shared_load_wavefronts = b_wavefronts * tile_ktiles;

    // The fill: global sectors and shared stores per block and K tile.
    let (rounds, fetch) = match &span {
        Some(s) => span_fetch(s, t, dtype, block_ktiles),
        None => {
            let fills = [0, 1].map(|i| Fill::new(task, &grid, t, i, dtype, gpu.shared_banks));
            (
                fills.each_ref().map(|f| f.rounds as f64),
                fills.each_ref().map(Fill::cost),
            )
        }
    };
    row.input_fetch_rounds = rounds[0];
    row.weight_fetch_rounds = rounds[1];
    row.mma_cp_async_bytes_per_block = row.mma_stage_bytes * block_ktiles;
    row.mma_cp_async_bytes = row.mma_stage_bytes * tile_ktiles;
    row.input_sectors_per_fetch = fetch[0].sectors_per_instruction;
    row.input_fetch_coalescing = fetch[0].coalescing;
    row.input_sectors_per_block = fetch[0].sectors_per_stage * block_ktiles;
    row.input_sectors = fetch[0].sectors_per_stage * tile_ktiles;
    row.weight_sectors_per_fetch = fetch[1].sectors_per_instruction;
    row.weight_fetch_coalescing = fetch[1].coalescing;
    row.weight_sectors_per_block = fetch[1].sectors_per_stage * block_ktiles;
    row.weight_sectors = fetch[1].sectors_per_stage * tile_ktiles;
    row.input_store_bank_conflict = fetch[0].store_conflict;
    row.weight_store_bank_conflict = fetch[1].store_conflict;
    row.input_shared_store_wavefronts = fetch[0].store_wavefronts_per_stage * tile_ktiles;
    row.weight_shared_store_wavefronts = fetch[1].store_wavefronts_per_stage * tile_ktiles;

    // The epilogue: each tile's stores and one bias load per warp and 8-column MMA
    // tile (8 elements: one sector), once per tile; under split-K every block also
    // stores its f32 partial sums (coalesced) and the tile's last warps read them back
    // (`split_traffic`).
    let out = epilogue(task, &grid, t);
    let split = match &stream {
        Some(s) => stream_traffic(row, s),
        None => split_traffic(row, state, grid.tiles as f64),
    };
    row.output_sectors_per_store = out.sectors_per_instruction;
    row.output_store_coalescing = out.coalescing;
    row.output_sectors_per_block = out.sectors_per_block + split.per_unit;
    row.output_sectors = out.sectors_per_block * grid.tiles as f64 + split.total;
    let bias_per_block = if c.bias.is_some() {
        warps * tiles_n
    } else {
        0.0
    };
    row.bias_sectors = bias_per_block * grid.tiles as f64;
    row.global_sectors =
        row.input_sectors + row.weight_sectors + row.output_sectors + row.bias_sectors;
    row.global_sectors_log2 = log2_1p(row.global_sectors);
    row.global_bytes = row.global_sectors * SECTOR_BYTES as f64;
    row.ideal_global_bytes = task.ideal_global_bytes;
    row.global_traffic_ratio = ratio(row.global_bytes, row.ideal_global_bytes);
    let global_sectors_per_block = row.input_sectors_per_block
        + row.weight_sectors_per_block
        + row.output_sectors_per_block
        + bias_per_block;

    // Shared memory: the fill's stores and the fragment loads.
    let shared_per_ktile = fetch[0].store_wavefronts_per_stage
        + fetch[1].store_wavefronts_per_stage
        + a_wavefronts
        + b_wavefronts;
    let shared_per_block = shared_per_ktile * block_ktiles;
    row.shared_wavefronts_per_block = shared_per_block;
    row.shared_wavefronts = row.input_shared_store_wavefronts
        + row.weight_shared_store_wavefronts
        + row.input_shared_load_wavefronts
        + row.weight_shared_load_wavefronts;
    row.shared_wavefronts_log2 = log2_1p(row.shared_wavefronts);
    row.shared_transfer_bytes = row.shared_wavefronts * WAVEFRONT_BYTES;

    // Occupancy, waves, parallelism and intensities.
    let (blocks_per_sm, busiest_sm_blocks) = fill_occupancy(
        gpu,
        row,
        u64::from(threads),
        warps,
        shared_bytes,
        allocated,
        grid_blocks as u64,
        f64::from(t.accumulators()),
    );
    row.mma_per_sm_wave = blocks_per_sm * row.mma_per_block;
    row.mma_per_sm = busiest_sm_blocks * row.mma_per_block;
    row.oi_global = ratio(task_flops, row.global_bytes);
    row.oi_shared = ratio(task_flops, row.shared_transfer_bytes);
    row.shared_cycles_per_sm = busiest_sm_blocks * shared_per_block;
    row.global_sectors_per_sm = busiest_sm_blocks * global_sectors_per_block;
}
