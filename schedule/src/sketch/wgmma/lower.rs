//! Lowering of the `wgmma` sketch (`wgmma`) to the loop nest: TMA copies into a ring
//! of `stages` shared buffers handed over by mbarriers, warpgroup MMAs on them, and the
//! epilogue from the accumulator registers.
//!
//! A block works through iterations `g`: the K tiles of its output tiles, in order. A
//! block owns one tile (the block index, `batch × M tiles × N tiles`, N fastest, or with
//! a `raster` band `batch × bands × N tiles × band`, so that neighbouring blocks share
//! columns of B and a band's rows of A), or, with `persistent` blocks, every
//! `persistent`-th tile from its index on, so that the copies of its next tile are in
//! flight while it stores the last one. Barriers
//! `0..stages` are the buffers' "full" barriers (one arrival: the producer's
//! `expect_tx` of the tile's bytes, which the copies complete), `stages..2·stages`
//! their "empty" ones (one arrival per consumer warpgroup). The producer initializes
//! them, a block barrier publishes them, and it fills buffers `0..stages` before the
//! loop. The producer is thread 0, between its own MMAs, or, with `producer_warp`, the
//! first thread of a warp of its own after the consumer warpgroups, which then waits for
//! buffers while the consumers multiply (warp specialization: the steps below are the
//! consumers' but 4, which is the producer's alone, and each role runs its own loop
//! over the iterations, `Stmt::Concurrent`, so that no producer branch sits among the
//! consumers' MMAs; the consumers' branch is on their warp-uniform warpgroup index).
//! Iteration `g`:
//!
//! 1. wait for `full[g % stages]` (parity `(g / stages) % 2`);
//! 2. `wgmma.fence`, then per k-step each warpgroup's `m_atoms` MMAs, one commit;
//! 3. `wgmma.wait_group in_flight`: iteration `r = g - in_flight`'s MMAs have completed,
//!    so one thread per warpgroup arrives on `empty[r % stages]`;
//! 4. thread 0 waits for that phase of `empty` (every warpgroup is done with the
//!    buffer) and issues iteration `r + stages` into it;
//! 5. after a tile's last K tile, the last group is waited for and each thread stores
//!    its accumulators through the fused epilogue, as the accumulator layout
//!    (`WgmmaAtom::accumulator`) places them; the next tile starts from zeros.
//!
//! With clusters (`cluster`), consecutive blocks work on a `cm × cn` rectangle of
//! neighbouring tiles (`WgmmaTiling::cluster_shape`; rank `i + cm·j` on tile row `i`,
//! column `j`; a pair lies along the raster order). The blocks of a row share A's
//! tile, those of a column B's (`WgmmaTiling::sharers`): each block's producer copies
//! its share (rows of a K-major tile, boxes of an N-major B) with TMA multicast into
//! every sharer, so each block's full barrier still expects the whole stage. A buffer
//! is then refilled by every sharer of either tile, so each consumer warpgroup releases
//! it on the empty barriers of its row's and its column's blocks (its own twice when
//! both tiles are shared; `WgmmaTiling::empty_arrivals`). A cluster barrier publishes
//! the initialized barriers before any copy, and another keeps each block alive until
//! no sharer arrives on it any more.
//!
//! With split-K the block works on units, not tiles: unit `u` is K chunk `u % split_k`
//! of output tile `u / split_k` (a tile's chunks neighbour in the grid, so they run
//! together and their partial sums stay in L2), a chunk's K tiles past K read zeros.
//! Step 5 then stores the thread's accumulators to the unit's partial sums in the
//! workspace (`(unit · accumulators + i) · consumer threads + thread`, coalesced), and
//! each consumer warp arrives on its tile's semaphore (one per tile and warp, as a
//! warp's partial sums are the only ones its lanes read back). The last warp to arrive
//! adds up the tile's partial sums in chunk order, so the sums do not depend on which
//! block came last, and runs the epilogue; its arrival resets the semaphore, so the
//! workspace is zeroed once, not per launch. With atomic sums (`SplitSums::Atomic`)
//! every unit adds into its tile's slots instead (`red.global.add` in L2), and the last
//! arrival reads one tile of sums, not one per chunk, clearing them for the next
//! launch.
//!
//! With stream-K (`stream_k` blocks), block `b` of `B` iterates over its run
//! `[b·I/B, (b+1)·I/B)` of the `I` tile-major iterations (every tile's K tiles), one loop
//! whose iterations past a short run do nothing. A tile's last K tile ends the block's
//! segment of it: a whole tile runs the epilogue; a part adds its sums atomically into
//! the tile's slots and arrives on the tile's semaphores with its K tiles as the weight,
//! so that the block whose segment completes the tile's K tiles (whichever arrives last)
//! takes the sums and runs the epilogue. The run's last segment is stored after the loop.

use crate::atom::Index;
use crate::atom::fragment;
use crate::atom::wgmma::{WARPGROUP_THREADS, WgmmaAtom};
use crate::ir::{
    Cond, Expr, Kernel, OUTPUT_MAP, Param, Ranks, Role, Scope, SharedPool, Staging, Stmt,
    WgmmaOperand,
};
use crate::launch::{Dim3, LaunchConfig, Target, TensorMapArg};
use crate::lower::common::{
    FixupReads, StreamRun, axis_extents, bind, decompose, gemm_store, gemm_valid, guarded,
    partial_index, partial_sum, split_fixup, tensor_params, var_or_zero, wrap_loops,
};
use crate::sketch::wgmma::geometry::{ATOM_M, OperandView, STAGING_BUFFERS, TmaGemm};
use crate::sketch::wgmma::tiling::WgmmaTiling;
use crate::state::SplitSums;
use crate::task::{Contraction, Task};

/// Lowers a validated `wgmma` state of `task` with its reduction split `split_k` ways,
/// its partial sums meeting as `sums` says.
pub(super) fn lower(task: &Task, t: &WgmmaTiling, (split_k, sums): (u32, SplitSums)) -> Kernel {
    let c = task.contraction();
    let gemm = TmaGemm::of(&c).expect("wgmma states are validated");
    let maps = [0, 1].map(|i| {
        gemm.tensor_box(&c, t, i)
            .expect("wgmma states are validated")
    });
    let mut params = tensor_params(&c);
    let (semaphores, workspace_bytes) = t.workspace(&gemm.view, split_k);
    if workspace_bytes > 0 {
        params.push(Param::Workspace { name: "workspace" });
    }
    let first_map = params.len();
    for (input, tensor) in maps.iter().enumerate() {
        params.push(Param::TensorMap {
            name: ["a_map", "b_map"][input],
            input,
            tensor: tensor.clone(),
        });
    }
    // TMA stores: the output's map after the inputs', and the output's buffer.
    let out_bytes = c.out_dtype.bytes();
    let store = (t.tma_store > 0).then(|| {
        let tensor = gemm.output_box(&c, t).expect("wgmma states are validated");
        let buffer = params
            .iter()
            .filter(|p| matches!(p, Param::Buffer { .. }))
            .position(|p| {
                matches!(
                    p,
                    Param::Buffer {
                        role: Role::Output,
                        ..
                    }
                )
            })
            .expect("a kernel has an output");
        params.push(Param::TensorMap {
            name: "out_map",
            input: OUTPUT_MAP,
            tensor: tensor.clone(),
        });
        (buffer, tensor)
    });
    let view = &gemm.view;
    // Persistent blocks each take every `grid`-th unit; otherwise one block per unit.
    let grid = t.grid(view, split_k).1 as i64;
    let mut lowering = WgmmaLowering {
        c: &c,
        gemm: &gemm,
        t,
        scope: Scope::new(grid, i64::from(t.threads())),
        first_map,
        chunk: t.chunk_ktiles(view, split_k) as i64,
        split_k: i64::from(split_k.max(1)),
        atomic: sums == SplitSums::Atomic,
        warpgroup: Expr::Const(0),
        stream: None,
    };
    let body = lowering.body();
    let elements = [0, 1].map(|i| (t.tile_elements(i, &gemm.view) * u64::from(t.stages)) as i64);
    let shared_bytes = t.shared_bytes(out_bytes) as u32;
    let mut launch = LaunchConfig::linear(grid as u32, t.threads(), shared_bytes);
    launch.target = Target::ArchSpecific;
    launch.cluster = Dim3::linear(t.cluster_blocks());
    launch.workspace_bytes = workspace_bytes;
    launch.tensor_maps = maps
        .into_iter()
        .enumerate()
        .chain(store)
        .map(|(buffer, tensor)| TensorMapArg { buffer, tensor })
        .collect();
    let staging = (t.tma_store > 0).then(|| Staging {
        offset: t.staging_offset() as i64,
        elements: (t.staging_bytes(out_bytes) / u64::from(out_bytes)) as i64,
    });
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
        launch,
        scope: lowering.scope,
        body,
        shared: SharedPool::Typed,
        staging,
    }
}

struct WgmmaLowering<'a> {
    c: &'a Contraction,
    gemm: &'a TmaGemm,
    t: &'a WgmmaTiling,
    scope: Scope,
    /// The parameter index of A's tensor map (B's follows).
    first_map: usize,
    /// K tiles of a unit (a tile's reduction chunk).
    chunk: i64,
    /// Units of an output tile.
    split_k: i64,
    /// The split's partial sums meet atomically (`SplitSums::Atomic`).
    atomic: bool,
    /// The thread's warpgroup (`body` binds it first).
    warpgroup: Expr,
    /// With stream-K, this block's run of iterations (`body` binds it).
    stream: Option<StreamRun>,
}

impl WgmmaLowering<'_> {
    fn stages(&self) -> i64 {
        i64::from(self.t.stages)
    }

    /// The full barrier of buffer `stage`.
    fn full(&self, stage: &Expr) -> Expr {
        stage.clone()
    }

    /// The empty barrier of buffer `stage`.
    fn empty(&self, stage: &Expr) -> Expr {
        self.scope.add(stage.clone(), Expr::Const(self.stages()))
    }

    /// The producer: thread 0, or with a producer warp that warp's first thread (after
    /// the consumer warpgroups, which stay aligned to warpgroups).
    fn producer(&self) -> Cond {
        let first = i64::from(self.t.consumer_threads()) * i64::from(self.t.producer_warp);
        Cond {
            expr: Expr::ThreadIdx,
            lo: (first > 0).then_some(first),
            hi: Some(first + 1),
        }
    }

    /// The first thread of each warpgroup (which issues its MMAs' and stores' single
    /// instructions).
    fn warpgroup_leader(&self) -> Cond {
        Cond {
            expr: self.scope.rem(Expr::ThreadIdx, WARPGROUP_THREADS),
            lo: None,
            hi: Some(1),
        }
    }

    /// The consumer warpgroups' threads (those before the producer warp's warpgroup),
    /// None when every thread is one.
    fn consumers(&self) -> Option<Cond> {
        self.scope
            .bound(&self.warpgroup, 0, i64::from(self.t.consumers))
    }

    /// Units of work: output tiles × K chunks.
    fn units(&self) -> i64 {
        self.t.grid(&self.gemm.view, self.split_k as u32).0 as i64
    }

    /// The unit that iteration `g` of this block works on: the block's index plus a
    /// grid's worth per round of K tiles.
    fn unit_of(&self, g: &Expr) -> Expr {
        let s = &self.scope;
        let round = s.div(g.clone(), self.chunk);
        s.add(Expr::BlockIdx, s.mul(round, self.scope.grid))
    }

    /// The output tile and K chunk of unit `unit`: a tile's chunks neighbour in the
    /// grid, or with clusters the cluster's blocks do (the same chunk of each tile of
    /// the cluster's rectangle), the chunks a cluster apart.
    fn tile_and_chunk(&self, unit: Expr) -> (Expr, Expr) {
        let s = &self.scope;
        let blocks = i64::from(self.t.cluster_blocks());
        if blocks == 1 || self.split_k == 1 {
            return (s.div(unit.clone(), self.split_k), s.rem(unit, self.split_k));
        }
        let rest = s.div(unit.clone(), blocks);
        let group = s.div(rest.clone(), self.split_k);
        let tile = s.add(s.mul(group, blocks), s.rem(unit, blocks));
        (tile, s.rem(rest, self.split_k))
    }

    /// The unit of chunk `chunk` of output tile `tile` (`tile_and_chunk`'s inverse).
    fn unit_of_tile(&self, tile: Expr, chunk: Expr) -> Expr {
        let s = &self.scope;
        let blocks = i64::from(self.t.cluster_blocks());
        let group = s.div(tile.clone(), blocks);
        let rest = s.add(s.mul(group, self.split_k), chunk);
        s.add(s.mul(rest, blocks), s.rem(tile, blocks))
    }

    /// The condition that iteration `g` has a unit (a persistent block's last round may
    /// not; a stream-K block's run ends), None when every one has.
    fn has_unit(&self, g: &Expr) -> Option<Cond> {
        if let Some(run) = &self.stream {
            return run.has(&self.scope, g);
        }
        self.scope.bound(&self.unit_of(g), 0, self.units())
    }

    /// The output tile and the K tile (of the tile's reduction) of iteration `g`.
    fn work(&self, g: &Expr) -> (Expr, Expr) {
        let s = &self.scope;
        if let Some(run) = &self.stream {
            return run.work(s, g);
        }
        let (tile, chunk) = self.tile_and_chunk(self.unit_of(g));
        let chunk = s.mul(chunk, self.chunk);
        (tile, s.add(chunk, s.rem(g.clone(), self.chunk)))
    }

    /// The batch, first row and first column of output tile `tile`, bound in `out`: in
    /// the raster order, row by row, or down bands of `raster` M tiles.
    fn origin(&mut self, out: &mut Vec<Stmt>, tile: Expr) -> (Expr, Expr, Expr) {
        let (t, view) = (self.t, &self.gemm.view);
        let (mtiles, ntiles) = t.tile_grid(view);
        let (mtiles, ntiles) = (mtiles as i64, ntiles as i64);
        let names =
            |names: &[&str]| -> Vec<String> { names.iter().map(|s| s.to_string()).collect() };
        // With clusters, a tile is a cluster's rectangle (a group of tiles) and the
        // block's rank in it, M fastest; the raster order walks the groups.
        let (cm, cn) = t.cluster_shape();
        let blocks = i64::from(t.cluster_blocks());
        let (group, rank) = if blocks > 1 {
            let rank = self.scope.rem(tile.clone(), blocks);
            let rank = bind(&mut self.scope, out, "rank", rank);
            (self.scope.div(tile, blocks), Some(rank))
        } else {
            (tile, None)
        };
        let (gm, gn) = (mtiles / i64::from(cm), ntiles / i64::from(cn));
        let (batch, bm, bn) = if t.raster > 1 {
            let band = i64::from(t.raster / cm);
            let block = decompose(
                &mut self.scope,
                out,
                group,
                &[view.batch as i64, gm / band, gn, band],
                &names(&["b_batch", "b_band", "b_n", "b_m_in"]),
            );
            let bm = self
                .scope
                .add(self.scope.mul(block[1].clone(), band), block[3].clone());
            (block[0].clone(), bm, block[2].clone())
        } else {
            let block = decompose(
                &mut self.scope,
                out,
                group,
                &[view.batch as i64, gm, gn],
                &names(&["b_batch", "b_m", "b_n"]),
            );
            (block[0].clone(), block[1].clone(), block[2].clone())
        };
        let (bm, bn) = match rank {
            Some(rank) => {
                let s = &self.scope;
                (
                    s.add(s.mul(bm, i64::from(cm)), s.rem(rank.clone(), i64::from(cm))),
                    s.add(s.mul(bn, i64::from(cn)), s.div(rank, i64::from(cm))),
                )
            }
            None => (bm, bn),
        };
        let m0 = self.scope.mul(bm, i64::from(t.block_m()));
        let n0 = self.scope.mul(bn, i64::from(t.block_n));
        let m0 = bind(&mut self.scope, out, "m0", m0);
        let n0 = bind(&mut self.scope, out, "n0", n0);
        (batch, m0, n0)
    }

    fn body(&mut self) -> Vec<Stmt> {
        let t = self.t;
        let mut body = Vec::new();
        let wg = self.scope.div(Expr::ThreadIdx, WARPGROUP_THREADS);
        let wg = if t.producer_warp > 0 {
            // Provably warp-uniform: the consumers' code path is a branch on it.
            let (lo, hi) = self.scope.range(&wg);
            let var = self.scope.var("warpgroup", lo, hi);
            body.push(Stmt::WarpUniform { var, value: wg });
            Expr::Var(var)
        } else {
            bind(&mut self.scope, &mut body, "warpgroup", wg)
        };
        self.warpgroup = wg;
        if t.stream_k > 0 {
            let stream = self.t.stream(&self.gemm.view);
            self.stream = Some(StreamRun::bind(&mut self.scope, &mut body, &stream));
        }

        let mut init = Vec::new();
        for s in 0..self.stages() {
            let s = Expr::Const(s);
            init.push(Stmt::MbarrierInit {
                barrier: self.full(&s),
                arrivals: 1,
            });
            init.push(Stmt::MbarrierInit {
                barrier: self.empty(&s),
                arrivals: t.consumers * t.empty_arrivals(),
            });
        }
        body.push(Stmt::If {
            conds: vec![self.producer()],
            body: init,
        });
        body.push(if t.cluster > 1 {
            Stmt::ClusterSync
        } else {
            Stmt::Sync
        });
        body.push(Stmt::ZeroAcc);

        // Iterations: the K tiles of every unit the block works on, in order (with
        // stream-K, of its run).
        let rounds = (self.units() + self.scope.grid - 1) / self.scope.grid;
        let iterations = match &self.stream {
            Some(run) => run.longest,
            None => rounds * self.chunk,
        };
        let mut prologue = Vec::new();
        for g in 0..iterations.min(self.stages()) {
            let g = Expr::Const(g);
            let mut issue = Vec::new();
            self.issue(&mut issue, (&g, &g));
            let exists = self.has_unit(&g);
            guarded(&mut prologue, exists, issue, true);
        }
        if t.producer_warp == 0 {
            // Thread 0 produces between its own MMAs: one loop for both roles.
            body.push(Stmt::If {
                conds: vec![self.producer()],
                body: prologue,
            });
            body.extend(self.rounds(Roles::Both, rounds));
            body.extend(self.stores_read());
        } else {
            // Warp specialization: the producer warp and the consumers each run their
            // own loop over the same iterations.
            prologue.extend(self.rounds(Roles::Producer, rounds));
            let mut consumer = self.rounds(Roles::Consumers, rounds);
            consumer.extend(self.stores_read());
            let consumers = self.consumers().into_iter().collect();
            body.push(Stmt::Concurrent {
                parts: vec![
                    Stmt::If {
                        conds: vec![self.producer()],
                        body: prologue,
                    },
                    Stmt::If {
                        conds: consumers,
                        body: consumer,
                    },
                ],
            });
        }
        // No block of a cluster exits while another may still arrive on its barriers.
        if t.cluster > 1 {
            body.push(Stmt::ClusterSync);
        }
        body
    }

    /// The loop over the block's units (`rounds` of them) and their K tiles, with what
    /// `roles` do in each iteration: the consumers' MMAs, release of a buffer and
    /// results, the producer's refill of the released buffer.
    fn rounds(&mut self, roles: Roles, rounds: i64) -> Vec<Stmt> {
        if self.stream.is_some() {
            return self.stream_loop(roles);
        }
        let iterations = rounds * self.chunk;
        // Rounds (one unit each) of K tiles; iteration g = round · chunk + kt.
        let round = (rounds > 1).then(|| self.scope.var("round", 0, rounds - 1));
        let kt = (self.chunk > 1).then(|| self.scope.var("kt", 0, self.chunk - 1));
        let (rv, ktv) = (var_or_zero(round), var_or_zero(kt));
        let mut iteration = Vec::new();
        let g = self.scope.add(self.scope.mul(rv.clone(), self.chunk), ktv);
        let g = bind(&mut self.scope, &mut iteration, "g", g);
        self.iteration(&mut iteration, roles, (&g, iterations));
        // A unit's K tiles, then its results, then fresh accumulators for the next.
        let mut tile_body = wrap_loops(&[kt], &[self.chunk], |_| false, iteration);
        let s = &self.scope;
        let unit = s.add(Expr::BlockIdx, s.mul(rv, s.grid));
        // A persistent block's rounds past the last unit do nothing.
        let has_unit = s.bound(&unit, 0, self.units());
        if roles.consumers() {
            let mut results = vec![
                Stmt::WgmmaWait { pending: 0 },
                Stmt::Block {
                    body: self.results(unit),
                },
            ];
            if rounds > 1 {
                results.push(Stmt::ZeroAcc);
            }
            self.for_consumers(roles, &mut tile_body, results);
        }
        let mut rounds_body = Vec::new();
        guarded(&mut rounds_body, has_unit, tile_body, false);
        wrap_loops(&[round], &[rounds], |_| false, rounds_body)
    }

    /// What `roles` do in iteration `g` (of `iterations`): the consumers wait for its
    /// buffer, multiply and commit, and wait for all but `in_flight` groups; then the
    /// iteration those completed releases its buffer, which the producer refills.
    fn iteration(&mut self, out: &mut Vec<Stmt>, roles: Roles, (g, iterations): (&Expr, i64)) {
        let t = self.t;
        if roles.consumers() {
            let stage = self.scope.rem(g.clone(), self.stages());
            let stage = bind(&mut self.scope, out, "stage", stage);
            let parity = self.scope.rem(self.scope.div(g.clone(), self.stages()), 2);
            let mut consume = vec![
                Stmt::MbarrierWait {
                    barrier: self.full(&stage),
                    parity,
                },
                Stmt::WgmmaFence,
            ];
            self.multiply(&mut consume, &stage);
            consume.push(Stmt::WgmmaCommit);
            consume.push(Stmt::WgmmaWait {
                pending: t.in_flight,
            });
            self.for_consumers(roles, out, consume);
        }
        let released = self
            .scope
            .add(g.clone(), Expr::Const(-i64::from(t.in_flight)));
        let mut release = Vec::new();
        self.release(&mut release, &released, roles);
        let exists = self.scope.bound(&released, 0, iterations);
        guarded(out, exists, release, false);
    }

    /// `body` for the consumer warpgroups: as it is in their own code path, else under
    /// the condition that selects them.
    fn for_consumers(&self, roles: Roles, out: &mut Vec<Stmt>, body: Vec<Stmt>) {
        match roles {
            Roles::Consumers => out.extend(body),
            _ => guarded(out, self.consumers(), body, false),
        }
    }

    /// This block's rank in its cluster (consecutive blocks form a cluster).
    fn rank(&self) -> Expr {
        self.scope
            .rem(Expr::BlockIdx, i64::from(self.t.cluster_blocks()))
    }

    /// The producer's copies of iteration `g` (a unit's K tile) into buffer `stage`:
    /// the full barrier armed with the tile's bytes, then A's box and B's boxes.
    ///
    /// K tile `kt` of a reduction with taps is run `kt % kblocks` of the innermost axis
    /// at tap `kt / kblocks` (its digits over the tap axes, the outermost unbounded: a
    /// split's last chunk past the end reads B's zeros there, and A, whose filter offsets
    /// must stay in range, the tap wrapped back into the filter).
    fn issue(&mut self, out: &mut Vec<Stmt>, (g, stage): (&Expr, &Expr)) {
        let t = self.t;
        let (tile, kt) = self.work(g);
        let (batch, m0, n0) = self.origin(out, tile);
        let view = &self.gemm.view;
        let s = &self.scope;
        let bk = t.block_k(view) as i64;
        let taps_extents: Vec<i64> = self.c.reduction[..self.c.reduction.len() - 1]
            .iter()
            .map(|r| i64::from(r.extent))
            .collect();
        let (k0, tap) = if taps_extents.is_empty() {
            (s.mul(kt, bk), Vec::new())
        } else {
            let kblocks = t.kblocks(view) as i64;
            let k0 = s.mul(s.rem(kt.clone(), kblocks), bk);
            (k0, digits(s, s.div(kt, kblocks), &taps_extents))
        };
        let bytes = (t.tile_bytes(0) + t.tile_bytes(1)) as i64;
        let full = self.full(stage);
        out.push(Stmt::ArriveExpectTx {
            barrier: full.clone(),
            bytes,
        });
        let stage_base = |input: usize| s.mul(stage.clone(), t.tile_elements(input, view) as i64);
        let batched = |mut coords: Vec<Expr>, input: usize| {
            if self.gemm.matrix(input).is_some_and(|m| m.batches > 1) {
                coords.push(batch.clone());
            }
            coords
        };
        // A's coordinates for its box from row `first`: a matrix's (K, row), or an
        // im2col walk's (channel, base pixel, image, then the tap's filter offsets).
        let a_coords = |first: Expr| match &self.gemm.a {
            OperandView::Matrix(_) => batched(vec![k0.clone(), first], 0),
            OperandView::Im2col(v) => {
                let rows = digits(s, first, &v.m_extents);
                let channel = s.add(s.mul(batch.clone(), v.group_channels as i64), k0.clone());
                let mut coords = vec![channel];
                for (d, position) in v.positions.iter().enumerate() {
                    let at = position.map_or(Expr::Const(0), |p| {
                        s.mul(rows[p].clone(), i64::from(v.im2col.traversal[d]))
                    });
                    coords.push(s.add(at, Expr::Const(i64::from(v.im2col.lower[d]))));
                }
                coords.push(rows[0].clone());
                for tap_of in &v.taps {
                    coords.push(tap_of.map_or(Expr::Const(0), |(r, dilation)| {
                        s.mul(s.rem(tap[r].clone(), taps_extents[r]), dilation)
                    }));
                }
                coords
            }
        };
        // B's coordinates at its first row (or column): K, the tap's dimensions
        // (innermost first), the row.
        let b_coords = |first: Expr| {
            let mut coords = vec![k0.clone()];
            coords.extend(tap.iter().rev().cloned());
            coords.push(first);
            batched(coords, 1)
        };
        // A K-major operand is one box of rows; a tile the cluster shares is dealt out
        // in one box of rows per sharer, each multicast to every sharer.
        let row_elements = t.block_k(view) as i64;
        let rows_load = |input: usize, first: &Expr, rows: u32| {
            let (first, at, multicast) = match self.sharing(input) {
                Some((share, ranks)) => {
                    let part = i64::from(rows / t.sharers(input));
                    (
                        s.add(first.clone(), s.mul(share.clone(), part)),
                        s.add(stage_base(input), s.mul(share, part * row_elements)),
                        Some(ranks),
                    )
                }
                None => (first.clone(), stage_base(input), None),
            };
            Stmt::TmaLoad {
                map: self.first_map + input,
                coords: if input == 0 {
                    a_coords(first)
                } else {
                    b_coords(first)
                },
                at,
                barrier: full.clone(),
                multicast,
            }
        };
        out.push(rows_load(0, &m0, t.block_m()));
        if view.b_k_major {
            out.push(rows_load(1, &n0, t.block_n));
            return;
        }
        // An N-major B is boxes of `n_box` columns, a shared one's dealt out between its
        // sharers.
        let n_box = i64::from(t.n_box());
        let box_elements = n_box * row_elements;
        let boxes = i64::from(t.boxes(1, view));
        let per_block = boxes / i64::from(t.sharers(1));
        let (first_box, multicast) = match self.sharing(1) {
            Some((share, ranks)) => (s.mul(share, per_block), Some(ranks)),
            None => (Expr::Const(0), None),
        };
        for j in 0..per_block {
            let b = s.add(first_box.clone(), Expr::Const(j));
            out.push(Stmt::TmaLoad {
                map: self.first_map + 1,
                coords: batched(
                    vec![s.add(n0.clone(), s.mul(b.clone(), n_box)), k0.clone()],
                    1,
                ),
                at: s.add(stage_base(1), s.mul(b, box_elements)),
                barrier: full.clone(),
                multicast: multicast.clone(),
            });
        }
    }

    /// Where input `input`'s tile is shared in a cluster: this block's share of it
    /// (its place among the sharers) and the sharers' ranks. For the block at rank
    /// `i + cm·j`, A's sharers are its row (ranks `i + cm·j'` for every `j'`; its share
    /// `j`), B's its column (ranks `i' + cm·j` for every `i'`; its share `i`); None
    /// where the tile is the block's own.
    fn sharing(&self, input: usize) -> Option<(Expr, Ranks)> {
        let t = self.t;
        if t.sharers(input) == 1 {
            return None;
        }
        let (cm, cn) = t.cluster_shape();
        let s = &self.scope;
        let rank = self.rank();
        let (i, j) = (
            s.rem(rank.clone(), i64::from(cm)),
            s.div(rank, i64::from(cm)),
        );
        Some(if input == 0 {
            let pattern = (0..cn).fold(0u16, |p, j| p | 1 << (cm * j));
            (j, Ranks { first: i, pattern })
        } else {
            let first = s.mul(j, i64::from(cm));
            (
                i,
                Ranks {
                    first,
                    pattern: (1u16 << cm) - 1,
                },
            )
        })
    }

    /// Every warpgroup's MMAs of one K tile from buffer `stage`.
    fn multiply(&mut self, out: &mut Vec<Stmt>, stage: &Expr) {
        let t = self.t;
        let view = &self.gemm.view;
        let n = i64::from(t.block_n);
        let atom = WgmmaAtom::for_dtype(self.c.dtype).expect("wgmma states are validated");
        let layouts = [0, 1].map(|i| t.operand_layout(atom, i, view));
        let tile_bytes = [0, 1].map(|i| t.tile_bytes(i) as i64);
        let s = &self.scope;
        let a_stage = s.mul(stage.clone(), tile_bytes[0]);
        let a_rows = s.mul(
            self.warpgroup.clone(),
            i64::from(t.consumer_m()) * i64::from(t.k_bytes),
        );
        let a_base = s.add(a_stage, a_rows);
        let b_base = s.mul(stage.clone(), tile_bytes[1]);
        let a_base = bind(&mut self.scope, out, "a_desc", a_base);
        let b_base = bind(&mut self.scope, out, "b_desc", b_base);
        for step in 0..t.block_k(view) as i64 / atom.k {
            for i in 0..i64::from(t.m_atoms) {
                let a_offset =
                    step * layouts[0].k_step_bytes() + i * i64::from(ATOM_M) * i64::from(t.k_bytes);
                let b_offset = step * layouts[1].k_step_bytes();
                out.push(Stmt::Wgmma {
                    acc: i * n / 2,
                    n,
                    a: WgmmaOperand {
                        input: 0,
                        start: self.scope.add(a_base.clone(), Expr::Const(a_offset)),
                        layout: layouts[0],
                    },
                    b: WgmmaOperand {
                        input: 1,
                        start: self.scope.add(b_base.clone(), Expr::Const(b_offset)),
                        layout: layouts[1],
                    },
                });
            }
        }
    }

    /// After iteration `released`'s MMAs completed: each warpgroup's leader arrives on
    /// its buffer's empty barrier, and the producer refills the buffer with iteration
    /// `released + stages` once every warpgroup has (each as far as `roles` go).
    fn release(&mut self, out: &mut Vec<Stmt>, released: &Expr, roles: Roles) {
        let stage = self.scope.rem(released.clone(), self.stages());
        let stage = bind(&mut self.scope, out, "released", stage);
        let parity = self
            .scope
            .rem(self.scope.div(released.clone(), self.stages()), 2);
        let empty = self.empty(&stage);
        // In a cluster, on the empty barriers of every block whose producer copies
        // into this buffer: the sharers of each shared tile.
        let shared: Vec<Stmt> = (0..2)
            .filter_map(|input| self.sharing(input))
            .map(|(_, ranks)| Stmt::ClusterArrive {
                barrier: empty.clone(),
                ranks,
            })
            .collect();
        let arrivals = if shared.is_empty() {
            vec![Stmt::MbarrierArrive {
                barrier: empty.clone(),
            }]
        } else {
            shared
        };
        let leaders = vec![Stmt::If {
            conds: vec![self.warpgroup_leader()],
            body: arrivals,
        }];
        if roles.consumers() {
            self.for_consumers(roles, out, leaders);
        }
        let next = self.scope.add(released.clone(), Expr::Const(self.stages()));
        let Some(refill) = self.has_unit(&next).filter(|_| roles.producer()) else {
            return;
        };
        let mut producer = vec![Stmt::MbarrierWait {
            barrier: empty,
            parity,
        }];
        self.issue(&mut producer, (&next, &stage));
        out.push(Stmt::If {
            conds: vec![self.producer(), refill],
            body: producer,
        });
    }

    /// A unit's results: without a split, the epilogue; with one, the unit's partial
    /// sums into the workspace (its own slots, or added into its tile's), then
    /// `split_fixup`.
    fn results(&mut self, unit: Expr) -> Vec<Stmt> {
        let mut out = Vec::new();
        if self.split_k == 1 {
            let place = self.place(&mut out, unit);
            let epilogue = if self.t.tma_store > 0 {
                self.staged_epilogue(&place)
            } else {
                self.epilogue(&place)
            };
            out.extend(epilogue);
            return out;
        }
        let tile = self.tile_and_chunk(unit.clone()).0;
        let tile = bind(&mut self.scope, &mut out, "tile", tile);
        let place = self.place(&mut out, tile.clone());
        let atomic = self.atomic;
        // A unit stores to its own slots, or adds into its tile's.
        let own = if atomic { tile.clone() } else { unit };
        let stores = self.partial_sums(&place, own, (false, atomic));
        out.extend(stores);
        let reads = if atomic {
            FixupReads::Take(self.partial_sums(&place, tile.clone(), (true, true)))
        } else {
            let chunk = self.scope.var("chunk", 0, self.split_k - 1);
            let unit = self.unit_of_tile(tile.clone(), Expr::Var(chunk));
            FixupReads::Chunks {
                chunk,
                adds: self.partial_sums(&place, unit, (true, false)),
            }
        };
        let fixup = self.fixup(&place, tile, reads, (self.split_k, Expr::Const(1)));
        out.push(fixup);
        out
    }

    /// The thread's partial sums of the tile at `place` into the workspace slots of
    /// `slots` (a unit's own, or its tile's, added `atomic`ally), or with `read` the
    /// fixup's reads of them.
    fn partial_sums(
        &mut self,
        place: &Place,
        slots: Expr,
        (read, atomic): (bool, bool),
    ) -> Vec<Stmt> {
        let sums = (
            i64::from(self.t.accumulators()),
            i64::from(self.t.consumer_threads()),
        );
        self.values(place, 1, |l, (row, col, acc)| {
            let at = partial_index(&l.scope, slots, acc.clone(), sums);
            let valid = gemm_valid(&l.scope, &l.gemm.view, &row, &col);
            vec![partial_sum(read, atomic, (acc, at, valid))]
        })
    }

    /// The end of a tile's part after its partial sums (`common::split_fixup`): each
    /// consumer warp arrives on the tile's semaphore with `weight`; the arrival that
    /// brings it to `arrivals` takes `reads` and runs the epilogue.
    fn fixup(
        &mut self,
        place: &Place,
        tile: Expr,
        reads: FixupReads,
        (arrivals, weight): (i64, Expr),
    ) -> Stmt {
        let epilogue = self.epilogue(place);
        let (t, warps) = (self.t, i64::from(self.t.consumer_warps()));
        let accumulators = i64::from(t.accumulators());
        let tile = (tile, warps, weight);
        split_fixup(&self.scope, (arrivals, accumulators), tile, reads, epilogue)
    }

    /// Stream-K's loop over the block's run, with what `roles` do in each iteration. A
    /// tile's last K tile ends the block's segment of that tile, whose results the
    /// consumers then store (and start the next from zeros); the run's last segment's
    /// are stored after the loop.
    fn stream_loop(&mut self, roles: Roles) -> Vec<Stmt> {
        let longest = self.stream.as_ref().expect("a stream-K lowering").longest;
        let gv = self.scope.var("g", 0, longest - 1);
        let g = Expr::Var(gv);
        let mut iteration = Vec::new();
        self.iteration(&mut iteration, roles, (&g, longest));
        if roles.consumers() {
            let (tile, _) = self.work(&g);
            let run = self.stream.as_ref().expect("a stream-K lowering");
            let (ends, weight) = run.segment_end(&self.scope, &g);
            let results = vec![
                Stmt::WgmmaWait { pending: 0 },
                Stmt::Block {
                    body: self.segment(tile, weight),
                },
                Stmt::ZeroAcc,
            ];
            let mut body = Vec::new();
            self.for_consumers(roles, &mut body, results);
            iteration.push(Stmt::If { conds: ends, body });
        }
        let mut out = Vec::new();
        guarded(&mut out, self.has_unit(&g), iteration, false);
        let mut out = wrap_loops(&[Some(gv)], &[longest], |_| false, out);
        if roles.consumers() {
            let run = self.stream.as_ref().expect("a stream-K lowering");
            let (tile, weight) = run.last_segment(&self.scope);
            let results = vec![
                Stmt::WgmmaWait { pending: 0 },
                Stmt::Block {
                    body: self.segment(tile, weight),
                },
            ];
            self.for_consumers(roles, &mut out, results);
        }
        out
    }

    /// The results of a stream-K block's segment of output tile `tile`, `weight` of its
    /// K tiles: a whole tile's epilogue; else its partial sums added into the tile's in
    /// the workspace, and the block whose segment completes the tile's K tiles reads
    /// and clears them and runs the epilogue.
    fn segment(&mut self, tile: Expr, weight: Expr) -> Vec<Stmt> {
        let mut out = Vec::new();
        let tile = bind(&mut self.scope, &mut out, "tile", tile);
        let weight = bind(&mut self.scope, &mut out, "segment", weight);
        let place = self.place(&mut out, tile.clone());
        let ktiles = self.chunk;
        let whole = self.scope.bound(&weight, ktiles, i64::MAX);
        let epilogue = self.epilogue(&place);
        guarded(&mut out, whole, epilogue, false);
        let mut part = self.partial_sums(&place, tile.clone(), (false, true));
        let take = FixupReads::Take(self.partial_sums(&place, tile.clone(), (true, true)));
        part.push(self.fixup(&place, tile, take, (ktiles, weight.clone())));
        let partial_cond = self.scope.bound(&weight, i64::MIN, ktiles);
        guarded(&mut out, partial_cond, part, false);
        out
    }

    /// Where this thread's accumulators of output tile `tile` lie, bound in `out`.
    fn place(&mut self, out: &mut Vec<Stmt>, tile: Expr) -> Place {
        let (batch, m0, n0) = self.origin(out, tile);
        let (t, c) = (self.t, self.c);
        let view = &self.gemm.view;
        let layout = WgmmaAtom::accumulator(i64::from(t.block_n));
        let lane = self.scope.rem(Expr::ThreadIdx, WARPGROUP_THREADS);
        let (tile_m0, tile_n0) = (m0.clone(), n0.clone());
        let row0 = self.scope.sum([
            m0,
            self.scope
                .mul(self.warpgroup.clone(), i64::from(t.consumer_m())),
            part(&self.scope, layout.row, Index::Lane, &lane),
        ]);
        let row0 = bind(&mut self.scope, out, "lane_row", row0);
        let col0 = self
            .scope
            .add(n0, part(&self.scope, layout.column, Index::Lane, &lane));
        let col0 = bind(&mut self.scope, out, "lane_col", col0);
        let (batch_ext, batch_names) = axis_extents(c, &view.batch_axes);
        let tile_batch = batch.clone();
        let batch = decompose(&mut self.scope, out, batch, &batch_ext, &batch_names);
        Place {
            batch,
            row0,
            col0,
            origin: (tile_batch, tile_m0, tile_n0),
        }
    }

    /// Loops over this thread's accumulators, `width` neighbouring columns at a time,
    /// around what `make` builds for each: given its output row, column and
    /// accumulator index.
    fn values(
        &mut self,
        place: &Place,
        width: i64,
        make: impl FnOnce(&mut Self, (Expr, Expr, Expr)) -> Vec<Stmt>,
    ) -> Vec<Stmt> {
        let t = self.t;
        let layout = WgmmaAtom::accumulator(i64::from(t.block_n));
        let vi = (t.m_atoms > 1).then(|| self.scope.var("ti", 0, i64::from(t.m_atoms) - 1));
        let ve = self.scope.var("e", 0, layout.values / width - 1);
        let (i, e) = (
            vi.map_or(Expr::Const(0), Expr::Var),
            self.scope.mul(Expr::Var(ve), width),
        );
        let s = &self.scope;
        let row = s.sum([
            place.row0.clone(),
            s.mul(i.clone(), i64::from(ATOM_M)),
            part(s, layout.row, Index::Value, &e),
        ]);
        let col = s.add(place.col0.clone(), part(s, layout.column, Index::Value, &e));
        let acc = s.add(s.mul(i, layout.values), e);
        let body = make(self, (row, col, acc));
        wrap_loops(
            &[vi, Some(ve)],
            &[i64::from(t.m_atoms), layout.values / width],
            |_| true,
            body,
        )
    }

    /// The epilogue: each thread's accumulators of its warpgroup's MMAs through the
    /// fused bias and ReLU into the output, two neighbouring columns per store where
    /// the output's columns are contiguous and even in number (so the pair is
    /// aligned).
    fn epilogue(&mut self, place: &Place) -> Vec<Stmt> {
        let c = self.c;
        let view = &self.gemm.view;
        let last_axis = c.spatial.len() - 1;
        let width: i64 = if view.n_axes == [last_axis] && view.n.is_multiple_of(2) {
            2
        } else {
            1
        };
        self.values(place, width, |l, (row, col, acc)| {
            gemm_store(
                &mut l.scope,
                c,
                &l.gemm.view,
                &place.batch,
                (row, col, acc, width as u32),
                (None, None),
            )
        })
    }

    /// The epilogue through TMA stores: each warpgroup stages its results, 64 rows of
    /// one MMA by `store_columns` at a time, through the fused bias and ReLU into one of
    /// its two staging buffers (as the output map's box lays it out: swizzled, so that
    /// the stores do not conflict), and its first thread writes the chunk with a TMA
    /// store, which clips the tails. Before a buffer is written again, that thread
    /// waits for the store that read it last (the other buffer's may still run), and a
    /// warpgroup barrier tells the others; after the writes, each thread's fence and a
    /// barrier hand them to the store.
    fn staged_epilogue(&mut self, place: &Place) -> Vec<Stmt> {
        let (t, c) = (self.t, self.c);
        let view = &self.gemm.view;
        let out_bytes = c.out_dtype.bytes();
        let columns = i64::from(t.store_columns(out_bytes));
        let buffer = t.staging_elements(out_bytes) as i64;
        let box_layout = self
            .gemm
            .output_box(c, t)
            .expect("wgmma states are validated")
            .shared_layout();
        let map = self.first_map + 2;
        let layout = WgmmaAtom::accumulator(i64::from(t.block_n));
        let lane = self.scope.rem(Expr::ThreadIdx, WARPGROUP_THREADS);
        let lane_row = part(&self.scope, layout.row, Index::Lane, &lane);
        let lane_col = part(&self.scope, layout.column, Index::Lane, &lane);
        let leader = self.warpgroup_leader();
        let sync = Stmt::NamedSync {
            id: self.scope.add(self.warpgroup.clone(), Expr::Const(1)),
            threads: WARPGROUP_THREADS as u32,
        };
        let (tile_batch, m0, n0) = place.origin.clone();
        let own = self
            .scope
            .mul(self.warpgroup.clone(), STAGING_BUFFERS as i64 * buffer);
        let chunks = i64::from(t.block_n) / columns;
        let count = i64::from(t.m_atoms) * chunks;
        let mut out = Vec::new();
        for n in 0..count {
            let (i, j) = (n / chunks, n % chunks);
            let base = self.scope.add(
                own.clone(),
                Expr::Const((n % STAGING_BUFFERS as i64) * buffer),
            );
            // The buffer's last store (two stores ago, or one where a tile has an odd
            // count, which alternates the buffers the other way round) has read it.
            let pending = u32::from(n > 0 || count % 2 == 0);
            out.push(Stmt::If {
                conds: vec![leader.clone()],
                body: vec![Stmt::BulkWait { pending }],
            });
            out.push(sync.clone());
            // This chunk's values: `columns / 2` per thread, from value `j · columns / 2`.
            let values = columns / 2;
            let ve = self.scope.var("e", 0, values / 2 - 1);
            let s = &self.scope;
            let e = s.add(s.mul(Expr::Var(ve), 2), Expr::Const(j * values));
            let row_in = s.add(lane_row.clone(), part(s, layout.row, Index::Value, &e));
            let col_in = s.add(
                lane_col.clone(),
                s.add(
                    part(s, layout.column, Index::Value, &e),
                    Expr::Const(-j * columns),
                ),
            );
            let row = s.sum([
                place.row0.clone(),
                Expr::Const(i * i64::from(ATOM_M)),
                part(s, layout.row, Index::Value, &e),
            ]);
            let col = s.add(place.col0.clone(), part(s, layout.column, Index::Value, &e));
            let acc = s.add(Expr::Const(i * layout.values), e.clone());
            let at = s.add(base.clone(), box_layout.expr(s, &row_in, &col_in));
            let store = gemm_store(
                &mut self.scope,
                c,
                view,
                &place.batch,
                (row, col, acc, 2),
                (None, Some(at)),
            );
            out.push(Stmt::For {
                var: ve,
                extent: values / 2,
                unroll: true,
                body: store,
            });
            out.push(Stmt::FenceProxyAsync);
            out.push(sync.clone());
            let s = &self.scope;
            let mut coords = vec![
                s.add(n0.clone(), Expr::Const(j * columns)),
                s.sum([
                    m0.clone(),
                    s.mul(self.warpgroup.clone(), i64::from(t.consumer_m())),
                    Expr::Const(i * i64::from(ATOM_M)),
                ]),
            ];
            if view.batch > 1 {
                coords.push(tile_batch.clone());
            }
            out.push(Stmt::If {
                conds: vec![leader.clone()],
                body: vec![Stmt::TmaStore {
                    map,
                    coords,
                    from: base,
                }],
            });
        }
        out
    }

    /// With TMA stores, each warpgroup's first thread waits at the end until its
    /// stores have read their staging buffers, which the block's exit frees.
    fn stores_read(&self) -> Vec<Stmt> {
        if self.t.tma_store == 0 {
            return Vec::new();
        }
        let mut conds: Vec<Cond> = self.consumers().into_iter().collect();
        conds.push(self.warpgroup_leader());
        vec![Stmt::If {
            conds,
            body: vec![Stmt::BulkWait { pending: 0 }],
        }]
    }
}

/// Which roles' work a loop over the iterations holds: both (thread 0 produces between
/// its MMAs), or, warp-specialized, one role's code path.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Roles {
    Both,
    Consumers,
    Producer,
}

impl Roles {
    fn consumers(self) -> bool {
        self != Roles::Producer
    }

    fn producer(self) -> bool {
        self != Roles::Consumers
    }
}

/// Where a thread's accumulators lie in the output: the tile's batch coordinates and
/// the thread's first row and column; and the tile's batch, first row and first column.
struct Place {
    batch: Vec<Expr>,
    row0: Expr,
    col0: Expr,
    origin: (Expr, Expr, Expr),
}

/// The part of `x` that `terms` of a fragment layout make of index kind `index`.
fn part(scope: &Scope, terms: &[crate::atom::Term], index: Index, x: &Expr) -> Expr {
    fragment::part(scope, terms, index, x.clone()).unwrap_or(Expr::Const(0))
}

/// The digits of `index` over `extents` (outer first), the outermost unbounded.
fn digits(scope: &Scope, index: Expr, extents: &[i64]) -> Vec<Expr> {
    let mut out = vec![Expr::Const(0); extents.len()];
    let mut inner = 1;
    for d in (0..extents.len()).rev() {
        let q = scope.div(index.clone(), inner);
        out[d] = if d == 0 { q } else { scope.rem(q, extents[d]) };
        inner *= extents[d];
    }
    out
}
