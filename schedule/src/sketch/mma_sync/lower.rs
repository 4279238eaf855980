//! Lowering of the tensor-core sketch (`mma`) to the loop nest.
//!
//! The grid is `split_k × batch × M tiles × N tiles` (the split outermost, as in the
//! CUDA-core sketch, then N tiles fastest so that neighbouring blocks share A rows in
//! L2). Each thread's share of a stage's fill is fixed: copy `v = round * threads +
//! thread` of an input's tile covers row `v / (row / width)` and `width` columns from
//! `v % (row / width) * width`; its row-side coordinates (the implicit GEMM's output
//! pixel, or the output channel) and its swizzled shared position are computed once,
//! before the reduction loop, and only the reduction-side coordinates are recomputed
//! per tile. Padding, tails of M, N and K, and a stem's three channels are all the same
//! predicate on the copy, which zero-fills.
//!
//! The reduction loop is `pipeline`'s ring of `stages` buffers handed over by
//! `cp.async` groups: the prologue issues tiles `0..stages-1` (one group each, empty
//! when the tile does not exist, so that `wait_group stages-2` always means "tile t has
//! landed"); iteration `t` waits for tile `t`, synchronizes (which also publishes that
//! every warp is done with the stage that tile `t + stages - 1` overwrites), issues
//! that tile, and multiplies tile `t`. One stage is the plain fill / wait / barrier /
//! multiply / barrier loop.
//!
//! Per k-step each warp loads one A fragment per 16-row MMA tile and one B fragment
//! per 8-column tile, then issues every (A, B) product; the epilogue writes each
//! thread's four accumulators per MMA tile through the fused epilogue (f32). Under
//! split-K each block stores its partial sums to the workspace (or adds them into its
//! tile's sums there, `SplitSums::Atomic`) and the last warp of a tile to arrive adds
//! them up and runs the epilogue (`common::split_fixup`), so any output type and a
//! ReLU work.
//!
//! Stream-K (`MmaTiling::stream_k`) runs the same ring over block `b`'s run of the
//! output tiles' K tiles (`crate::stream_k`): each fill and product finds its output
//! tile and K tile from the iteration, so a fill's row-side coordinates are computed
//! per iteration, not hoisted. A tile's last K tile ends the block's segment of it: a
//! whole tile runs the epilogue; a part adds its sums atomically into the tile's slots
//! and arrives on the tile's semaphores weighted by its K tiles, and the arrival that
//! completes them takes the sums and runs the epilogue. The run's last segment ends
//! after the loop.
//!
//! Row spans (`MmaTiling::row_span`, `crate::row_span`) change three things: the grid
//! tiles padded pixels (output rows rounded up to 16-pixel groups; the padding pixels
//! are not stored), a K tile is one filter row whose stage holds each group's raw
//! input-row run (16-byte copies, hoisted but for the input row), read by 32-bit
//! fragment loads (`OperandLayout::Span`), and the weights of the block's filter rows
//! are read once before the ring into as many B tiles, which the K tiles then index.

use crate::atom::span::GROUP_ROWS;
use crate::atom::{Index, MmaAtom, OperandLayout, SharedTileLayout, fragment};
use crate::gemm::GemmView;
use crate::ir::{Cond, Expr, GlobalRead, Kernel, Param, Scope, SharedPool, SharedWrite, Stmt, Var};
use crate::launch::LaunchConfig;
use crate::lower::common::{
    FixupReads, StreamRun, affine_terms, axis_extents, bind, decompose, gemm_store, gemm_valid,
    guarded, partial_index, partial_sum, split_fixup, tensor_params, var_or_zero, wrap_loops,
};
use crate::lower::pipeline::{self, CpAsyncGroups, Stages};
use crate::row_span::COPY_ELEMENTS;
use crate::sketch::mma_sync::geometry::SpanStaging;
use crate::sketch::mma_sync::tiling::MmaTiling;
use crate::state::SplitSums;
use crate::task::{Contraction, Task};

/// Lowers a validated tensor-core state of `task`.
pub(super) fn lower(task: &Task, tiling: &MmaTiling, split: (u32, SplitSums)) -> Kernel {
    let split_k = split.0;
    let c = task.contraction();
    let view = GemmView::of(&c).expect("tensor-core states are validated");
    let span = tiling
        .span_staging(&c, split_k)
        .expect("tensor-core states are validated");
    let tiled = MmaTiling::tiled_view(&view, span.as_ref());
    let mut lowering = MmaLowering::new(&c, (&view, &tiled), tiling, split, span);
    let body = lowering.body();
    let t = tiling;
    let stages = i64::from(t.stages);
    let elements = match &span {
        None => lowering.layouts.map(|l| l.elements() * stages),
        Some(s) => [
            s.a.elements() * stages,
            lowering.layouts[1].elements() * s.held_rows,
        ],
    };
    let mut params = tensor_params(&c);
    let (semaphores, workspace_bytes) = t.workspace(&tiled, split_k);
    if workspace_bytes > 0 {
        params.push(Param::Workspace { name: "workspace" });
    }
    Kernel {
        name: task.key(),
        params,
        dtype: c.dtype,
        out_dtype: c.out_dtype,
        relu: c.relu,
        tile_offsets: [0, elements[0]],
        tile_elements: elements,
        accumulators: i64::from(t.accumulators()),
        split_k: 1,
        semaphores: semaphores as i64,
        launch: LaunchConfig {
            workspace_bytes,
            ..LaunchConfig::linear(
                u32::try_from(lowering.scope.grid).expect("grid checked by validation"),
                t.threads(),
                t.shared_bytes(c.dtype, span.as_ref()) as u32,
            )
        },
        scope: lowering.scope,
        body,
        shared: SharedPool::Typed,
        staging: None,
    }
}

/// One thread's copy of one fill round, hoisted out of the reduction loop.
struct Copy {
    /// The copy exists (`v` below the tile's copies); None when every thread has one.
    exists: Option<Cond>,
    /// Position of its first element within a stage's tile (swizzle applied).
    shared: Expr,
    /// Row or column of the tile along the reduction, to add to the tile's first K.
    k_local: Expr,
    /// Coordinates of the row side (M or N axes), and their bounds.
    side_coords: Vec<(usize, Expr)>,
    side_valid: Vec<Cond>,
}

/// One thread's copy of 16 bytes of a group's run (row spans), hoisted out of the
/// reduction loop: all but the input row, which the filter row (the K tile) moves.
struct RunCopy {
    exists: Option<Cond>,
    /// Position within a stage's A runs.
    shared: Expr,
    /// The group's image times the input height, and its first filter row's input row.
    image_row: Expr,
    row0: Expr,
    /// The element within the input row, and the bounds of it and of the image.
    element: Expr,
    valid: Vec<Cond>,
}

/// The pipeline ring's view of the lowering (`pipeline::Stages`): what its local
/// tiles are, and the warp's origin and lane.
struct Tiles<'l, 'a> {
    lowering: &'l mut MmaLowering<'a>,
    walk: Walk<'l>,
    warp: &'l (Expr, Expr, Expr),
}

/// What the ring's local tiles are.
enum Walk<'l> {
    /// The K tiles of split chunk `z` of one output tile (batch coordinates `batch`),
    /// filled by the hoisted `copies` (or `runs`, under row spans).
    Chunk {
        copies: &'l [Vec<Copy>; 2],
        runs: &'l [RunCopy],
        z: &'l Expr,
        batch: &'l [Expr],
    },
    /// Stream-K: the iterations of the block's run.
    Stream(&'l StreamRun),
}

impl Stages for Tiles<'_, '_> {
    fn scope(&mut self) -> &mut Scope {
        &mut self.lowering.scope
    }
    fn fill(&mut self, local: Expr, out: &mut Vec<Stmt>) {
        match &self.walk {
            Walk::Chunk {
                copies,
                runs,
                z,
                batch,
            } => self.lowering.fill(out, (copies, runs), z, batch, local),
            Walk::Stream(run) => self.lowering.stream_fill(out, run, local),
        }
    }
    fn consume(&mut self, local: Expr, stage: Expr, out: &mut Vec<Stmt>) {
        let (wm, wn, _) = self.warp;
        let l = &mut *self.lowering;
        match &self.walk {
            Walk::Chunk { z, .. } => {
                let (_, exists) = l.tile(z, local.clone());
                l.compute(out, exists, local, stage, wm, wn);
            }
            Walk::Stream(run) => {
                let exists = run.has(&l.scope, &local);
                l.compute(out, exists, local.clone(), stage, wm, wn);
                // A tile's last K tile that is not the run's last ends the segment.
                let (tile, _) = run.work(&l.scope, &local);
                let (ends, weight) = run.segment_end(&l.scope, &local);
                let mut body = l.segment(tile, weight, self.warp);
                body.push(Stmt::ZeroAcc);
                out.push(Stmt::If { conds: ends, body });
            }
        }
    }
}

struct MmaLowering<'a> {
    c: &'a Contraction,
    view: &'a GemmView,
    /// The view the grid tiles (`MmaTiling::tiled_view`).
    tiled: &'a GemmView,
    span: Option<SpanStaging>,
    t: &'a MmaTiling,
    split: i64,
    scope: Scope,
    layouts: [SharedTileLayout; 2],
    atom: &'static MmaAtom,
    block_k: i64,
    k_step: i64,
    ktiles: i64,
    /// K tiles per split chunk.
    chunk: i64,
    /// The split's partial sums meet atomically (`SplitSums::Atomic`).
    atomic: bool,
}

impl<'a> MmaLowering<'a> {
    fn new(
        c: &'a Contraction,
        (view, tiled): (&'a GemmView, &'a GemmView),
        t: &'a MmaTiling,
        (split_k, sums): (u32, SplitSums),
        span: Option<SpanStaging>,
    ) -> Self {
        let block_k = t.block_k(c.dtype) as i64;
        let ktiles = t.ktiles(view, c.dtype, span.as_ref()) as i64;
        let split = i64::from(split_k);
        let grid = t.grid_blocks(tiled, split_k) as i64;
        MmaLowering {
            c,
            view,
            tiled,
            span,
            t,
            split,
            atomic: sums == SplitSums::Atomic,
            scope: Scope::new(grid, i64::from(t.threads())),
            layouts: [0, 1].map(|i| t.tile_layout(i, view, c.dtype)),
            atom: MmaAtom::sizing(c.dtype),
            block_k,
            k_step: MmaTiling::k_step(c.dtype) as i64,
            ktiles,
            chunk: (ktiles + split - 1) / split,
        }
    }

    fn extents(&self, axes: &[usize]) -> (Vec<i64>, Vec<String>) {
        axis_extents(self.c, axes)
    }

    fn body(&mut self) -> Vec<Stmt> {
        if let Some(span) = self.span.filter(|_| self.t.persistent > 0) {
            return self.persistent_body(&span);
        }
        if self.t.stream_k > 0 {
            return self.stream_body();
        }
        let (t, view) = (self.t, self.tiled);
        let mut body = vec![Stmt::ZeroAcc];
        // Block coordinates: split, batch, M tile, N tile.
        let mtiles = ceil_div(view.m as i64, i64::from(t.block_m));
        let ntiles = ceil_div(view.n as i64, i64::from(t.block_n));
        let names: Vec<String> = ["b_split", "b_batch", "b_m", "b_n"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let block = decompose(
            &mut self.scope,
            &mut body,
            Expr::BlockIdx,
            &[self.split, view.batch as i64, mtiles, ntiles],
            &names,
        );
        let [z, batch, bm, bn] = [0, 1, 2, 3].map(|i| block[i].clone());
        let (batch_ext, batch_names) = self.extents(&view.batch_axes);
        let batch_coords = decompose(&mut self.scope, &mut body, batch, &batch_ext, &batch_names);
        let m0 = self.scope.mul(bm, i64::from(t.block_m));
        let n0 = self.scope.mul(bn, i64::from(t.block_n));
        let m0 = bind(&mut self.scope, &mut body, "m0", m0);
        let n0 = bind(&mut self.scope, &mut body, "n0", n0);

        let (copies, runs): ([Vec<Copy>; 2], Vec<RunCopy>) = match self.span {
            None => (
                [0, 1].map(|i| self.copies(&mut body, i, &m0, &n0)),
                Vec::new(),
            ),
            Some(span) => {
                let runs = self.runs(&mut body, &span, &m0);
                self.hold_weights(&mut body, &span, &z, &n0);
                ([Vec::new(), Vec::new()], runs)
            }
        };
        let warp = self.warp_origin(&mut body);
        body.extend(self.tile_nest((&copies, &runs), (&z, &batch_coords), (&m0, &n0), &warp));
        body
    }

    /// One output tile's reduction, the `pipeline` ring over its K tiles, then its
    /// epilogue (`store`).
    fn tile_nest(
        &mut self,
        (copies, runs): (&[Vec<Copy>; 2], &[RunCopy]),
        (z, batch): (&Expr, &[Expr]),
        (m0, n0): (&Expr, &Expr),
        (wm, wn, lane): &(Expr, Expr, Expr),
    ) -> Vec<Stmt> {
        let (stages, tiles) = (i64::from(self.t.stages), self.chunk);
        let mut nest = Vec::new();
        let warp = (wm.clone(), wn.clone(), lane.clone());
        let mut ring = Tiles {
            lowering: self,
            walk: Walk::Chunk {
                copies,
                runs,
                z,
                batch,
            },
            warp: &warp,
        };
        let main = pipeline::ring(&mut ring, &CpAsyncGroups, stages, tiles, &mut nest);
        nest.extend(main);
        nest.extend(self.store(batch, m0, n0, &warp));
        nest
    }

    /// Stream-K: block `b` of `B` runs the ring over its run `[b·I/B, (b+1)·I/B)` of
    /// the `I` iterations (`crate::stream_k`), one loop whose iterations past a short
    /// run do nothing; segments end inside it (`Tiles::consume`) and after it.
    fn stream_body(&mut self) -> Vec<Stmt> {
        let stream = self.t.stream(self.view, self.c.dtype);
        let mut body = vec![Stmt::ZeroAcc];
        let run = StreamRun::bind(&mut self.scope, &mut body, &stream);
        let warp = self.warp_origin(&mut body);
        let stages = i64::from(self.t.stages);
        let mut ring = Tiles {
            lowering: self,
            walk: Walk::Stream(&run),
            warp: &warp,
        };
        let main = pipeline::ring(&mut ring, &CpAsyncGroups, stages, run.longest, &mut body);
        body.extend(main);
        let (tile, weight) = run.last_segment(&self.scope);
        body.extend(self.segment(tile, weight, &warp));
        body
    }

    /// The results of a stream-K block's segment of output tile `tile`, `weight` of its
    /// K tiles: a whole tile's epilogue; else its sums added into the tile's in the
    /// workspace, and the arrival that completes the tile's K tiles takes them and runs
    /// the epilogue.
    fn segment(&mut self, tile: Expr, weight: Expr, warp: &(Expr, Expr, Expr)) -> Vec<Stmt> {
        let mut out = Vec::new();
        let tile = bind(&mut self.scope, &mut out, "tile", tile);
        let weight = bind(&mut self.scope, &mut out, "segment", weight);
        let (batch, m0, n0) = self.tile_origin(&mut out, tile.clone());
        let origin = self.lane_origin(&mut out, &m0, &n0, warp);
        let ktiles = self.ktiles;
        let whole = self.scope.bound(&weight, ktiles, i64::MAX);
        let epilogue = self.epilogue(&origin, &batch);
        guarded(&mut out, whole, epilogue, false);
        let mut part = self.partial(&origin, tile.clone(), (false, true));
        let take = FixupReads::Take(self.partial(&origin, tile.clone(), (true, true)));
        let epilogue = self.epilogue(&origin, &batch);
        part.push(self.fixup(tile, take, (ktiles, weight.clone()), epilogue));
        let partial = self.scope.bound(&weight, i64::MIN, ktiles);
        guarded(&mut out, partial, part, false);
        out
    }

    /// The batch coordinates and first row and column of output tile `tile` (batch, M
    /// tiles, N tiles; N fastest), bound in `out`.
    fn tile_origin(&mut self, out: &mut Vec<Stmt>, tile: Expr) -> (Vec<Expr>, Expr, Expr) {
        let (t, view) = (self.t, self.tiled);
        let mtiles = ceil_div(view.m as i64, i64::from(t.block_m));
        let ntiles = ceil_div(view.n as i64, i64::from(t.block_n));
        let names: Vec<String> = ["b_batch", "b_m", "b_n"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let block = decompose(
            &mut self.scope,
            out,
            tile,
            &[view.batch as i64, mtiles, ntiles],
            &names,
        );
        let [batch, bm, bn] = [0, 1, 2].map(|i| block[i].clone());
        let (batch_ext, batch_names) = self.extents(&view.batch_axes);
        let batch = decompose(&mut self.scope, out, batch, &batch_ext, &batch_names);
        let m0 = self.scope.mul(bm, i64::from(t.block_m));
        let n0 = self.scope.mul(bn, i64::from(t.block_n));
        let m0 = bind(&mut self.scope, out, "m0", m0);
        let n0 = bind(&mut self.scope, out, "n0", n0);
        (batch, m0, n0)
    }

    /// A persistent row-span grid: block `b` keeps N tile `b % N tiles`, whose weights
    /// it reads once, and works through M tiles `b / N tiles`, then every `persistent /
    /// N tiles`-th after it, each its own ring and epilogue; a barrier after each tile
    /// keeps the next one's prologue from overwriting a stage a slower warp still reads.
    fn persistent_body(&mut self, span: &SpanStaging) -> Vec<Stmt> {
        let (t, view) = (self.t, self.tiled);
        let mtiles = ceil_div(view.m as i64, i64::from(t.block_m));
        let ntiles = ceil_div(view.n as i64, i64::from(t.block_n));
        let step = i64::from(t.persistent) / ntiles;
        let mut body = Vec::new();
        let s = &self.scope;
        let (bn, first) = (s.rem(Expr::BlockIdx, ntiles), s.div(Expr::BlockIdx, ntiles));
        let n0 = s.mul(bn, i64::from(t.block_n));
        let n0 = bind(&mut self.scope, &mut body, "n0", n0);
        let first = bind(&mut self.scope, &mut body, "b_first", first);
        let z = Expr::Const(0);
        self.hold_weights(&mut body, span, &z, &n0);
        let warp = self.warp_origin(&mut body);
        let rounds = ceil_div(mtiles, step);
        let round = self.loop_var("tile_round", rounds);
        let s = &self.scope;
        let bm = s.add(first, s.mul(var_or_zero(round), step));
        let mut round_body = Vec::new();
        let bm = bind(&mut self.scope, &mut round_body, "b_m", bm);
        let mut tile = vec![Stmt::ZeroAcc];
        let exists = self.scope.bound(&bm, 0, mtiles);
        let m0 = self.scope.mul(bm, i64::from(t.block_m));
        let m0 = bind(&mut self.scope, &mut tile, "m0", m0);
        let runs = self.runs(&mut tile, span, &m0);
        let copies = [Vec::new(), Vec::new()];
        tile.extend(self.tile_nest((&copies, &runs), (&z, &[]), (&m0, &n0), &warp));
        tile.push(Stmt::Sync);
        guarded(&mut round_body, exists, tile, false);
        body.extend(wrap_loops(&[round], &[rounds], |_| false, round_body));
        body
    }

    /// Each warp's first row and column in the block's tile, and the lane.
    fn warp_origin(&mut self, body: &mut Vec<Stmt>) -> (Expr, Expr, Expr) {
        let t = self.t;
        let warp = self.scope.div(Expr::ThreadIdx, 32);
        let lane = self.scope.rem(Expr::ThreadIdx, 32);
        let wm = self.scope.div(warp.clone(), i64::from(t.warps_n));
        let wm = self.scope.mul(wm, i64::from(t.warp_m()));
        let wm = bind(&mut self.scope, body, "warp_m0", wm);
        let wn = self.scope.rem(warp, i64::from(t.warps_n));
        let wn = self.scope.mul(wn, i64::from(t.warp_n()));
        let wn = bind(&mut self.scope, body, "warp_n0", wn);
        (wm, wn, lane)
    }

    fn loop_var(&mut self, name: &str, extent: i64) -> Option<Var> {
        (extent > 1).then(|| self.scope.var(name, 0, extent - 1))
    }

    /// The K tile that local tile `local` of split chunk `z` is, and the condition
    /// that it exists.
    fn tile(&self, z: &Expr, local: Expr) -> (Expr, Option<Cond>) {
        let s = &self.scope;
        let tile = s.add(s.mul(z.clone(), self.chunk), local);
        let exists = s.bound(&tile, 0, self.ktiles);
        (tile, exists)
    }

    /// Every fill round of input `input` for this thread, hoisted.
    fn copies(&mut self, out: &mut Vec<Stmt>, input: usize, m0: &Expr, n0: &Expr) -> Vec<Copy> {
        let (t, view) = (self.t, self.view);
        let layout = self.layouts[input];
        let width = i64::from(t.vector[input]);
        let per_row = layout.row_elements / width;
        let total = layout.rows * per_row;
        let threads = self.scope.threads;
        let rounds = (total + threads - 1) / threads;
        let tensor = self.c.inputs[input].tensor;
        // Rows run along the reduction for an N-major B, else along M (A) or N (B).
        let rows_along_k = input == 1 && !view.b_k_major;
        let (side_axes, side_base, side_extent) = if input == 0 {
            (&view.m_axes, m0, view.m as i64)
        } else {
            (&view.n_axes, n0, view.n as i64)
        };
        let (side_ext, side_names) = self.extents(side_axes);
        let side_names: Vec<String> = side_names.iter().map(|n| format!("{tensor}_{n}")).collect();
        (0..rounds)
            .map(|r| {
                let s = &self.scope;
                let v = s.add(Expr::ThreadIdx, Expr::Const(r * threads));
                let exists = s.bound(&v, 0, total);
                let row = s.div(v.clone(), per_row);
                let col = s.mul(s.rem(v, per_row), width);
                let row = bind(&mut self.scope, out, &format!("{tensor}_row{r}"), row);
                let col = bind(&mut self.scope, out, &format!("{tensor}_col{r}"), col);
                let shared = layout.expr(&self.scope, &row, &col);
                let shared = bind(&mut self.scope, out, &format!("{tensor}_sh{r}"), shared);
                let (k_local, side_local) = if rows_along_k { (row, col) } else { (col, row) };
                let side = self.scope.add(side_base.clone(), side_local);
                let side = bind(&mut self.scope, out, &format!("{tensor}_side{r}"), side);
                let side_valid: Vec<Cond> = self
                    .scope
                    .bound(&side, 0, side_extent)
                    .into_iter()
                    .collect();
                let names: Vec<String> = side_names.iter().map(|n| format!("{n}{r}")).collect();
                let coords = decompose(&mut self.scope, out, side, &side_ext, &names);
                Copy {
                    exists,
                    shared,
                    k_local,
                    side_coords: side_axes.iter().copied().zip(coords).collect(),
                    side_valid,
                }
            })
            .collect()
    }

    /// Issues the copies of local K tile `local` (of chunk `z`) into its stage.
    fn fill(
        &mut self,
        out: &mut Vec<Stmt>,
        (copies, runs): (&[Vec<Copy>; 2], &[RunCopy]),
        z: &Expr,
        batch: &[Expr],
        local: Expr,
    ) {
        let (tile, exists) = self.tile(z, local.clone());
        let stage = self.scope.rem(local, i64::from(self.t.stages));
        let mut body = Vec::new();
        match self.span {
            Some(span) => self.fill_runs(&mut body, &span, runs, &tile, &stage),
            None => self.fill_copies(&mut body, copies, batch, tile, &stage),
        }
        guarded(out, exists, body, true);
    }

    /// Issues the copies of stream-K iteration `local` of `run` into its stage: its
    /// output tile's copies, computed here, at its K tile.
    fn stream_fill(&mut self, out: &mut Vec<Stmt>, run: &StreamRun, local: Expr) {
        let exists = run.has(&self.scope, &local);
        let s = &self.scope;
        let stage = s.rem(local.clone(), i64::from(self.t.stages));
        let (tile, kt) = run.work(s, &local);
        let mut body = Vec::new();
        let tile = bind(&mut self.scope, &mut body, "fill_tile", tile);
        let (batch, m0, n0) = self.tile_origin(&mut body, tile);
        let copies = [0, 1].map(|i| self.copies(&mut body, i, &m0, &n0));
        self.fill_copies(&mut body, &copies, &batch, kt, &stage);
        guarded(out, exists, body, true);
    }

    /// The copies of K tile `tile` (of the output tile whose batch coordinates are
    /// `batch` and whose copies are `copies`) into stage `stage`.
    fn fill_copies(
        &mut self,
        body: &mut Vec<Stmt>,
        copies: &[Vec<Copy>; 2],
        batch: &[Expr],
        tile: Expr,
        stage: &Expr,
    ) {
        let k0 = self.scope.mul(tile, self.block_k);
        let k0 = bind(&mut self.scope, body, "k0", k0);
        for (input, rounds) in copies.iter().enumerate() {
            let access = &self.c.inputs[input];
            let tensor = access.tensor;
            let stage_base = self
                .scope
                .mul(stage.clone(), self.layouts[input].elements());
            for (r, copy) in rounds.iter().enumerate() {
                let mut copy_body = Vec::new();
                let kk = self.scope.add(k0.clone(), copy.k_local.clone());
                let kk = bind(
                    &mut self.scope,
                    &mut copy_body,
                    &format!("{tensor}_k{r}"),
                    kk,
                );
                let mut valid = copy.side_valid.clone();
                valid.extend(self.scope.bound(&kk, 0, self.view.k as i64));
                let mut spatial = vec![Expr::Const(0); self.c.spatial.len()];
                for (&a, x) in self.view.batch_axes.iter().zip(batch) {
                    spatial[a] = x.clone();
                }
                for (a, x) in &copy.side_coords {
                    spatial[*a] = x.clone();
                }
                // Dimensions that are the flattened reduction itself (conv2d's KRSC
                // weights after K, matmul's K) add `kk` as it is: no decomposition and
                // no bounds beyond `kk < K`.
                let lead = flat_reduction_lead(access, self.c);
                let red = if lead.is_some() {
                    vec![Expr::Const(0); self.c.reduction.len()]
                } else {
                    let red_ext: Vec<i64> = self
                        .c
                        .reduction
                        .iter()
                        .map(|a| i64::from(a.extent))
                        .collect();
                    let red_names: Vec<String> = self
                        .c
                        .reduction
                        .iter()
                        .map(|a| format!("{tensor}_{}{r}", a.name))
                        .collect();
                    decompose(
                        &mut self.scope,
                        &mut copy_body,
                        kk.clone(),
                        &red_ext,
                        &red_names,
                    )
                };
                let dims = lead.unwrap_or(access.index.len());
                let mut global = match lead {
                    Some(_) => kk.clone(),
                    None => Expr::Const(0),
                };
                for (d, (index, stride)) in access
                    .index
                    .iter()
                    .zip(access.strides())
                    .enumerate()
                    .take(dims)
                {
                    let g = affine_terms(&self.scope, index, &spatial, &red);
                    let g = self.scope.add(g, Expr::Const(index.offset));
                    let g = bind(
                        &mut self.scope,
                        &mut copy_body,
                        &format!("{tensor}_g{d}_{r}"),
                        g,
                    );
                    valid.extend(self.scope.bound(&g, 0, i64::from(access.shape[d])));
                    global = self.scope.add(global, self.scope.mul(g, stride));
                }
                let shared = self.scope.add(stage_base.clone(), copy.shared.clone());
                let width = self.t.vector[input];
                copy_body.push(Stmt::AsyncCopy {
                    read: GlobalRead {
                        input,
                        at: global,
                        valid,
                        width,
                    },
                    write: SharedWrite {
                        input,
                        at: shared,
                        width,
                        step: 1,
                        vector: true,
                    },
                });
                guarded(body, copy.exists.clone(), copy_body, false);
            }
        }
    }

    /// Every 16-byte copy of a stage's runs for this thread, hoisted: copy `v` is
    /// piece `v % pieces` of group `v / pieces`, whose first pixel is padded pixel
    /// `m0 + 16·group` (its image unbounded: a group past the last pixel copies zeros).
    fn runs(&mut self, out: &mut Vec<Stmt>, s: &SpanStaging, m0: &Expr) -> Vec<RunCopy> {
        let span = &s.span;
        let pieces = s.a.group_elements / COPY_ELEMENTS;
        let total = s.a.groups * pieces;
        let threads = self.scope.threads;
        let rounds = (total + threads - 1) / threads;
        (0..rounds)
            .map(|r| {
                let sc = &self.scope;
                let v = sc.add(Expr::ThreadIdx, Expr::Const(r * threads));
                let exists = sc.bound(&v, 0, total);
                let group = sc.div(v.clone(), pieces);
                let piece = sc.rem(v, pieces);
                let pixel = sc.add(m0.clone(), sc.mul(group.clone(), GROUP_ROWS));
                let pixel = bind(&mut self.scope, out, &format!("run_pixel{r}"), pixel);
                let sc = &self.scope;
                let per_image = span.out_height * span.row_pixels;
                let image = sc.div(pixel.clone(), per_image);
                let out_row = sc.rem(sc.div(pixel.clone(), span.row_pixels), span.out_height);
                let column = sc.rem(pixel, span.row_pixels);
                let image = bind(&mut self.scope, out, &format!("run_image{r}"), image);
                let sc = &self.scope;
                let image_row = sc.mul(image.clone(), span.height);
                let row0 = sc.add(sc.mul(out_row, span.stride_h), Expr::Const(-span.pad_h));
                let element = sc.sum([
                    sc.mul(column, span.row_step),
                    sc.mul(piece.clone(), COPY_ELEMENTS),
                    Expr::Const(-span.lead),
                ]);
                let shared = sc.add(
                    sc.mul(group, s.a.group_elements),
                    sc.mul(piece, COPY_ELEMENTS),
                );
                let image_row = bind(&mut self.scope, out, &format!("run_rows{r}"), image_row);
                let row0 = bind(&mut self.scope, out, &format!("run_ih{r}"), row0);
                let element = bind(&mut self.scope, out, &format!("run_x{r}"), element);
                let shared = bind(&mut self.scope, out, &format!("run_sh{r}"), shared);
                let sc = &self.scope;
                let valid = [
                    sc.bound(&element, 0, span.row_elements),
                    sc.bound(&image, 0, span.images),
                ]
                .into_iter()
                .flatten()
                .collect();
                RunCopy {
                    exists,
                    shared,
                    image_row,
                    row0,
                    element,
                    valid,
                }
            })
            .collect()
    }

    /// Copies the runs of filter row `tile` into stage `stage`.
    fn fill_runs(
        &mut self,
        out: &mut Vec<Stmt>,
        s: &SpanStaging,
        runs: &[RunCopy],
        tile: &Expr,
        stage: &Expr,
    ) {
        let span = &s.span;
        let stage_base = self.scope.mul(stage.clone(), s.a.elements());
        for (r, run) in runs.iter().enumerate() {
            let sc = &self.scope;
            let row = sc.add(run.row0.clone(), sc.mul(tile.clone(), span.dilation_h));
            let mut body = Vec::new();
            let row = bind(&mut self.scope, &mut body, &format!("run_row{r}"), row);
            let sc = &self.scope;
            let mut valid = run.valid.clone();
            valid.extend(sc.bound(&row, 0, span.height));
            let at = sc.add(
                sc.mul(sc.add(run.image_row.clone(), row), span.row_elements),
                run.element.clone(),
            );
            body.push(Stmt::AsyncCopy {
                read: GlobalRead {
                    input: 0,
                    at,
                    valid,
                    width: COPY_ELEMENTS as u32,
                },
                write: SharedWrite {
                    input: 0,
                    at: sc.add(stage_base.clone(), run.shared.clone()),
                    width: COPY_ELEMENTS as u32,
                    step: 1,
                    vector: true,
                },
            });
            guarded(out, run.exists.clone(), body, false);
        }
    }

    /// Reads the weights of the block's filter rows (its split chunk's) into shared
    /// memory once, element by element: filter row `rr` of the chunk is the `rr`-th B
    /// tile, its column `k` tap `k - zero_columns` of the row, zeros elsewhere.
    fn hold_weights(&mut self, out: &mut Vec<Stmt>, s: &SpanStaging, z: &Expr, n0: &Expr) {
        let span = &s.span;
        let layout = self.layouts[1];
        let tile = layout.elements();
        let total = s.held_rows * tile;
        let threads = self.scope.threads;
        let rounds = (total + threads - 1) / threads;
        // Batches of unrolled rounds, so that a thread's loads are in flight together
        // (one at a time, each waits for L2: 112 rounds took ~15 µs per block).
        let unrolled = rounds.min(HELD_LOADS_IN_FLIGHT);
        let batches = (rounds + unrolled - 1) / unrolled;
        let batch = self.loop_var("w_batch", batches);
        let round_var = self.loop_var("w_round", unrolled);
        let sc = &self.scope;
        let round = sc.add(sc.mul(var_or_zero(batch), unrolled), var_or_zero(round_var));
        let v = sc.add(sc.mul(round, threads), Expr::ThreadIdx);
        let mut body = Vec::new();
        let v = bind(&mut self.scope, &mut body, "w_v", v);
        let sc = &self.scope;
        let held = sc.div(v.clone(), tile);
        let n = sc.rem(sc.div(v.clone(), self.block_k), i64::from(self.t.block_n));
        let k = sc.rem(v.clone(), self.block_k);
        let filter_row = sc.add(sc.mul(z.clone(), self.chunk), held.clone());
        let channel = sc.add(n0.clone(), n.clone());
        let tap = sc.add(k.clone(), Expr::Const(-span.zero_columns));
        // Without a split (or an N offset) the filter row (channel) is the held row (n).
        let same = [filter_row == held, channel == n];
        let held = bind(&mut self.scope, &mut body, "w_held", held);
        let n = bind(&mut self.scope, &mut body, "w_n", n);
        let k = bind(&mut self.scope, &mut body, "w_k", k);
        let filter_row = match same[0] {
            true => held.clone(),
            false => bind(&mut self.scope, &mut body, "w_r", filter_row),
        };
        let channel = match same[1] {
            true => n.clone(),
            false => bind(&mut self.scope, &mut body, "w_channel", channel),
        };
        let tap = bind(&mut self.scope, &mut body, "w_tap", tap);
        let sc = &self.scope;
        // Past the last held element (a last round short of threads) nothing is copied;
        // elsewhere zeros stand for what the filter does not have.
        let exists = sc.bound(&v, 0, total);
        let valid: Vec<Cond> = [
            sc.bound(&filter_row, 0, span.filter_rows),
            sc.bound(&channel, 0, self.view.n as i64),
            sc.bound(&tap, 0, span.taps),
        ]
        .into_iter()
        .flatten()
        .collect();
        // KRSC weights: output channel, filter row, then the row's taps.
        let at = sc.sum([
            sc.mul(channel, span.filter_rows * span.taps),
            sc.mul(filter_row, span.taps),
            tap,
        ]);
        let shared = sc.add(sc.mul(held, tile), layout.expr(sc, &n, &k));
        let copy = Stmt::AsyncCopy {
            read: GlobalRead {
                input: 1,
                at,
                valid,
                width: 1,
            },
            write: SharedWrite {
                input: 1,
                at: shared,
                width: 1,
                step: 1,
                vector: true,
            },
        };
        guarded(&mut body, exists, vec![copy], false);
        out.extend(wrap_loops(
            &[batch, round_var],
            &[batches, unrolled],
            |d| d == 1,
            body,
        ));
    }

    /// The products of local K tile `local` from stage `stage`, where `exists`.
    fn compute(
        &mut self,
        out: &mut Vec<Stmt>,
        exists: Option<Cond>,
        local: Expr,
        stage: Expr,
        wm: &Expr,
        wn: &Expr,
    ) {
        let t = self.t;
        let mut body = Vec::new();
        // Row spans: A's stage holds runs, and B is the held weights' filter row.
        let a_layout = match &self.span {
            Some(s) => OperandLayout::Span(s.a),
            None => OperandLayout::Tile(self.layouts[0]),
        };
        let base_a = self.scope.mul(stage.clone(), a_layout.elements());
        let b_tile = if self.span.is_some() { local } else { stage };
        let base_b = self.scope.mul(b_tile, self.layouts[1].elements());
        let base_a = bind(&mut self.scope, &mut body, "stage_a", base_a);
        let base_b = bind(&mut self.scope, &mut body, "stage_b", base_b);
        for ks in 0..i64::from(t.k_steps) {
            let k = Expr::Const(ks * self.k_step);
            for i in 0..t.tiles_m() as usize {
                body.push(Stmt::LoadFragment {
                    input: 0,
                    frag: i,
                    count: 1,
                    base: base_a.clone(),
                    row: self
                        .scope
                        .add(wm.clone(), Expr::Const(self.atom.m * i as i64)),
                    k: k.clone(),
                    layout: a_layout,
                    k_step: self.k_step,
                    k_major: true,
                });
            }
            // B fragments in pairs (one `ldmatrix.x4`), a last odd one alone.
            for j in (0..t.tiles_n() as usize).step_by(2) {
                body.push(Stmt::LoadFragment {
                    input: 1,
                    frag: j,
                    count: (t.tiles_n() as usize - j).min(2),
                    base: base_b.clone(),
                    row: self
                        .scope
                        .add(wn.clone(), Expr::Const(self.atom.n * j as i64)),
                    k: k.clone(),
                    layout: OperandLayout::Tile(self.layouts[1]),
                    k_step: self.k_step,
                    k_major: self.view.b_k_major,
                });
            }
            for i in 0..t.tiles_m() as usize {
                for j in 0..t.tiles_n() as usize {
                    body.push(Stmt::Mma {
                        acc: self.atom.c.values * (i * t.tiles_n() as usize + j) as i64,
                        a: i,
                        b: j,
                    });
                }
            }
        }
        guarded(out, exists, body, true);
    }

    /// The epilogue: each thread's accumulators of every MMA tile of its warp through
    /// the fused epilogue; split, the block's partial sums into the workspace (its own
    /// slots, or added into its tile's), then `split_fixup` (a tile's chunks are
    /// `tiles` blocks apart).
    fn store(
        &mut self,
        batch: &[Expr],
        m0: &Expr,
        n0: &Expr,
        warp: &(Expr, Expr, Expr),
    ) -> Vec<Stmt> {
        let mut head = Vec::new();
        let origin = self.lane_origin(&mut head, m0, n0, warp);
        if self.split == 1 {
            head.extend(self.epilogue(&origin, batch));
            return head;
        }
        let tiles = self.scope.grid / self.split;
        let atomic = self.atomic;
        let tile_of = |l: &mut Self, head: &mut Vec<Stmt>| {
            let tile = l.scope.rem(Expr::BlockIdx, tiles);
            bind(&mut l.scope, head, "tile", tile)
        };
        // A block stores to its own slots (its index), or adds into its tile's.
        let atomic_tile = atomic.then(|| tile_of(self, &mut head));
        let own = atomic_tile.clone().unwrap_or(Expr::BlockIdx);
        let stores = self.partial(&origin, own, (false, atomic));
        head.extend(stores);
        let tile = match atomic_tile {
            Some(tile) => tile,
            None => tile_of(self, &mut head),
        };
        let reads = if atomic {
            FixupReads::Take(self.partial(&origin, tile.clone(), (true, true)))
        } else {
            let chunk = self.scope.var("chunk", 0, self.split - 1);
            let unit = self
                .scope
                .add(self.scope.mul(Expr::Var(chunk), tiles), tile.clone());
            FixupReads::Chunks {
                chunk,
                adds: self.partial(&origin, unit, (true, false)),
            }
        };
        let epilogue = self.epilogue(&origin, batch);
        head.push(self.fixup(tile, reads, (self.split, Expr::Const(1)), epilogue));
        head
    }

    /// This thread's first output row and column in the tile at (`m0`, `n0`): the
    /// warp's origin and the lane's part of the accumulator fragment, bound in `out`.
    fn lane_origin(
        &mut self,
        out: &mut Vec<Stmt>,
        m0: &Expr,
        n0: &Expr,
        (wm, wn, lane): &(Expr, Expr, Expr),
    ) -> (Expr, Expr) {
        let layout = self.atom.c;
        let g = part(&self.scope, layout.row, Index::Lane, lane);
        let row0 = self.scope.sum([m0.clone(), wm.clone(), g]);
        let row0 = bind(&mut self.scope, out, "lane_row", row0);
        let q2 = part(&self.scope, layout.column, Index::Lane, lane);
        let col0 = self.scope.sum([n0.clone(), wn.clone(), q2]);
        let col0 = bind(&mut self.scope, out, "lane_col", col0);
        (row0, col0)
    }

    /// The fused epilogue of this thread's accumulators from its first row and column
    /// `origin`; under row spans, padded pixels map to their output rows (where output
    /// rows are not whole groups), and the padding pixels are not stored.
    fn epilogue(&mut self, origin: &(Expr, Expr), batch: &[Expr]) -> Vec<Stmt> {
        let (c, view) = (self.c, self.view);
        let span = self
            .span
            .map(|s| s.span)
            .filter(|s| s.row_pixels != s.out_width);
        self.values(origin, |scope, (row, col, acc)| match span {
            None => gemm_store(scope, c, view, batch, (row, col, acc, 1), (None, None)),
            Some(span) => {
                // A padded row: its pixel, stored where the output row has it.
                let pixel = scope.rem(row.clone(), span.row_pixels);
                let rows = scope.div(row, span.row_pixels);
                let real = scope.add(scope.mul(rows, span.out_width), pixel.clone());
                let store = gemm_store(scope, c, view, batch, (real, col, acc, 1), (None, None));
                let mut out = Vec::new();
                guarded(
                    &mut out,
                    scope.bound(&pixel, 0, span.out_width),
                    store,
                    false,
                );
                out
            }
        })
    }

    /// Every accumulator's partial-sum statement in `unit`'s slots of the workspace
    /// (`partial_sum`): with `read` the fixup's read, else the store (an addition with
    /// `atomic`).
    fn partial(
        &mut self,
        origin: &(Expr, Expr),
        unit: Expr,
        (read, atomic): (bool, bool),
    ) -> Vec<Stmt> {
        let sums = (
            i64::from(self.t.accumulators()),
            i64::from(self.t.threads()),
        );
        let tiled = self.tiled;
        self.values(origin, |scope, (row, col, acc)| {
            let at = partial_index(scope, unit, acc.clone(), sums);
            let valid = gemm_valid(scope, tiled, &row, &col);
            vec![partial_sum(read, atomic, (acc, at, valid))]
        })
    }

    /// The fixup of output tile `tile` (`split_fixup`): each warp arrives on its own
    /// semaphore with `weight`, and the arrival that brings it to `arrivals` reads the
    /// sums (`reads`) and runs `epilogue`.
    fn fixup(
        &mut self,
        tile: Expr,
        reads: FixupReads,
        (arrivals, weight): (i64, Expr),
        epilogue: Vec<Stmt>,
    ) -> Stmt {
        let t = self.t;
        let (warps, accumulators) = (
            i64::from(t.warps_m * t.warps_n),
            i64::from(t.accumulators()),
        );
        let tile = (tile, warps, weight);
        split_fixup(&self.scope, (arrivals, accumulators), tile, reads, epilogue)
    }

    /// Loops over this thread's accumulators (every MMA tile of its warp, each
    /// fragment value) around what `make` builds for each, given its output row,
    /// column and accumulator index; `origin` is the thread's first row and column.
    fn values(
        &mut self,
        origin: &(Expr, Expr),
        make: impl FnOnce(&mut Scope, (Expr, Expr, Expr)) -> Vec<Stmt>,
    ) -> Vec<Stmt> {
        let t = self.t;
        let layout = self.atom.c;
        let vi = self.loop_var("ti", i64::from(t.tiles_m()));
        let vj = self.loop_var("tj", i64::from(t.tiles_n()));
        let ve = self.scope.var("e", 0, layout.values - 1);
        let (i, j, e) = (var_or_zero(vi), var_or_zero(vj), Expr::Var(ve));
        let s = &self.scope;
        let row = s.sum([
            origin.0.clone(),
            s.mul(i.clone(), self.atom.m),
            part(s, layout.row, Index::Value, &e),
        ]);
        let col = s.sum([
            origin.1.clone(),
            s.mul(j.clone(), self.atom.n),
            part(s, layout.column, Index::Value, &e),
        ]);
        let acc = s.add(
            s.mul(s.add(s.mul(i, i64::from(t.tiles_n())), j), layout.values),
            e,
        );
        let body = make(&mut self.scope, (row, col, acc));
        wrap_loops(
            &[vi, vj, Some(ve)],
            &[
                i64::from(t.tiles_m()),
                i64::from(t.tiles_n()),
                layout.values,
            ],
            |_| true,
            body,
        )
    }
}

/// The part of `x` that `terms` of a fragment layout make of index kind `index`.
fn part(scope: &Scope, terms: &[crate::atom::Term], index: Index, x: &Expr) -> Expr {
    fragment::part(scope, terms, index, x.clone()).unwrap_or(Expr::Const(0))
}

/// When `access`'s last dimensions are exactly the reduction axes in order (each
/// indexed by its axis alone, with the axis's extent), their row-major offset is the
/// flattened reduction index itself: the number of dimensions before them, provided
/// those do not use the reduction.
fn flat_reduction_lead(access: &crate::task::Access, c: &Contraction) -> Option<usize> {
    use crate::task::AxisRef;
    let r = c.reduction.len();
    let lead = access.index.len().checked_sub(r)?;
    let suffix_ok = (0..r).all(|i| {
        access.index[lead + i].is_axis(AxisRef::Reduction(i))
            && access.shape[lead + i] == c.reduction[i].extent
    });
    let lead_free = access.index[..lead]
        .iter()
        .all(|ix| (0..r).all(|i| ix.coeff(AxisRef::Reduction(i)) == 0));
    (suffix_ok && lead_free).then_some(lead)
}

/// Held-weight loads a thread keeps in flight: rounds unrolled per batch.
const HELD_LOADS_IN_FLIGHT: i64 = 8;

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}
