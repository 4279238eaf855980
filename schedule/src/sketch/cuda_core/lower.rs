//! Lowering of the CUDA-core sketch: a state of a task becomes a loop nest (see `ir`).
//!
//! The tile sizes follow the sketch "SSSRRSRS": block and thread indices are decomposed
//! into per-axis tile coordinates; each outer reduction step stages both inputs in
//! shared memory (all threads fetch cooperatively, `vector_width` floats at a time,
//! zero-filled outside the tensors); the middle and inner reduction loops then
//! accumulate the thread's register tile (virtual thread × outer × inner positions per
//! axis), which is finally written through the epilogue.
//!
//! One deliberate change from Ansor's loop order: the outer register loops sit inside
//! the inner reduction loops, not between the middle and inner ones. With them between,
//! every outer position replicates the inner reduction loop with its own hoisted
//! addresses, and NVRTC's sm_90 kernels spilled (measured: 123 of 460 sampled ResNet and
//! YOLO kernels had stack frames). With all register loops innermost, each reduction
//! step is one outer product whose live registers are the accumulators plus that step's
//! operands. The outer level still decides which outputs a thread owns.
//!
//! Shared layouts (`state::SharedLayout`): the fetch keeps its coalesced order (vector
//! `v` covers floats `v * width ..` of the box in the tensor's row-major order) and
//! stores through the tile's strides — as one vector where the tensor's last dimension
//! is contiguous and rows stay aligned, else component by component; the inner
//! product's reads use the same strides. With a spatial dimension innermost (matmul A's
//! `m`), one thread's register-tile operands along that axis are consecutive floats at
//! an offset `((v * threads + t) * outer + o) * inner + i` that is a multiple of
//! `inner` up to `i`, so the compiler can merge them into 64- and 128-bit loads.
//!
//! Register-tile loops are always unrolled (they index the accumulator array, which
//! must stay in registers); reduction and fetch loops are unrolled when the work they
//! would replicate is at most `unroll_max_step` multiply-adds.
//!
//! Split-K (`split_k > 1`): the grid holds `split_k` blocks per output tile, the split
//! coordinate outermost in `blockIdx.x` (so that the blocks of one tile run far apart
//! and their atomics rarely meet). The per-axis stage loops become one flattened loop
//! over the block's chunk of `ceil(stages / split_k)` stages, decomposed back into
//! per-axis stage coordinates; when the split does not divide the stages, a uniform
//! branch skips the stages past the end (every thread of a block takes it alike, so
//! its barriers are safe). The epilogue adds into the output with `atomicAdd`, the bias
//! only from chunk 0. Without a split the nest is exactly the one above.
//!
//! Register prefetch (`State::prefetch`) is a transform of the finished nest, the pass
//! in `lower::prefetch`: lowering only gives it what it rewrites, the flattened stage loop
//! (built as for split-K, with split coordinate 0 when the reduction is not split).

use crate::ir::{Expr, GlobalRead, Kernel, Scope, SharedPool, SharedWrite, Stmt, Var};
use crate::launch::LaunchConfig;
use crate::lower::common::{
    affine_terms, bind, decompose, epilogue_store, guarded, tensor_params, var_or_zero, wrap_loops,
};
use crate::lower::prefetch::register_prefetch;
use crate::sketch::cuda_core::geometry::{ReductionUnroll, Tiling, fetch_unrolled};
use crate::state::State;
use crate::task::{Access, Contraction, Task};

/// Lowers a validated CUDA-core state of `task`, applying the state's transform passes.
pub(super) fn lower(task: &Task, state: &State) -> Kernel {
    let c = task.contraction();
    let tiling = Tiling::new(&c, state);
    let kernel = Lowering::new(task, &c, state, &tiling).kernel();
    if state.prefetch {
        register_prefetch(kernel)
    } else {
        kernel
    }
}

struct Lowering<'a> {
    c: &'a Contraction,
    state: &'a State,
    tiling: &'a Tiling,
    scope: Scope,
    name: String,
}

impl<'a> Lowering<'a> {
    fn new(task: &Task, c: &'a Contraction, state: &'a State, tiling: &'a Tiling) -> Self {
        let grid = tiling.blocks.iter().product::<i64>() * i64::from(state.split_k);
        let threads = i64::from(state.threads());
        Lowering {
            c,
            state,
            tiling,
            scope: Scope::new(grid, threads),
            name: task.key(),
        }
    }

    /// Binds `value` to a named `const int` unless it is already trivial.
    fn bind(&mut self, out: &mut Vec<Stmt>, name: &str, value: Expr) -> Expr {
        bind(&mut self.scope, out, name, value)
    }

    /// A loop over `0..extent`, or the constant 0 (and no loop) when the extent is 1.
    fn loop_var(&mut self, name: &str, extent: i64) -> Option<Var> {
        (extent > 1).then(|| self.scope.var(name, 0, extent - 1))
    }

    /// Decomposes `index` (row-major over `extents`, last fastest) into coordinates.
    fn decompose(
        &mut self,
        out: &mut Vec<Stmt>,
        index: Expr,
        extents: &[i64],
        names: &[String],
    ) -> Vec<Expr> {
        decompose(&mut self.scope, out, index, extents, names)
    }

    fn kernel(mut self) -> Kernel {
        let c = self.c;
        let state = self.state;
        let tiling = self.tiling;
        let mut body = vec![Stmt::ZeroAcc];

        let spatial_names: Vec<String> = c.spatial.iter().map(|a| a.name.to_string()).collect();
        let block_names: Vec<String> = spatial_names.iter().map(|n| format!("b_{n}")).collect();
        let thread_names: Vec<String> = spatial_names.iter().map(|n| format!("t_{n}")).collect();
        let split = i64::from(state.split_k);
        // The split coordinate (the reduction chunk), outermost in blockIdx.x.
        let (split_coord, block) = if split > 1 {
            let extents: Vec<i64> = std::iter::once(split)
                .chain(tiling.blocks.iter().copied())
                .collect();
            let names: Vec<String> = std::iter::once("b_split".to_string())
                .chain(block_names)
                .collect();
            let mut coords = self.decompose(&mut body, Expr::BlockIdx, &extents, &names);
            let split_coord = coords.remove(0);
            (Some(split_coord), coords)
        } else {
            let block = self.decompose(&mut body, Expr::BlockIdx, &tiling.blocks, &block_names);
            (None, block)
        };
        let thread_extents: Vec<i64> = state.spatial.iter().map(|s| i64::from(s.thread)).collect();
        let thread = self.decompose(&mut body, Expr::ThreadIdx, &thread_extents, &thread_names);
        let block_base: Vec<Expr> = block
            .iter()
            .zip(&tiling.block_tile)
            .map(|(b, &t)| self.scope.mul(b.clone(), t))
            .collect();

        match &split_coord {
            // The prefetch pass rewrites one flattened stage loop, as split-K builds it.
            None if state.prefetch => {
                body.extend(self.split_stages(Expr::Const(0), &block_base, &thread));
            }
            None => {
                // Outer reduction loops: one shared-memory stage per iteration.
                let stage_vars: Vec<Option<Var>> = (0..c.reduction.len())
                    .map(|r| {
                        let name = format!("ro_{}", c.reduction[r].name);
                        self.loop_var(&name, tiling.stages[r])
                    })
                    .collect();
                let stage_coords: Vec<Expr> = stage_vars.iter().map(|v| var_or_zero(*v)).collect();
                let mut stage = Vec::new();
                self.stage(&mut stage, &block_base, &stage_coords, &thread);
                body.extend(wrap_loops(&stage_vars, &tiling.stages, |_| false, stage));
            }
            Some(z) => body.extend(self.split_stages(z.clone(), &block_base, &thread)),
        }

        body.extend(self.store(&block_base, &thread, split_coord.as_ref()));
        let launch = LaunchConfig {
            zero_output: split > 1,
            ..LaunchConfig::linear(
                u32::try_from(self.scope.grid).expect("grid checked by validation"),
                state.threads(),
                tiling.shared_bytes() as u32,
            )
        };
        Kernel {
            name: self.name,
            params: tensor_params(c),
            dtype: c.dtype,
            out_dtype: c.out_dtype,
            relu: c.relu,
            tile_offsets: [tiling.tiles[0].offset, tiling.tiles[1].offset],
            tile_elements: [tiling.tiles[0].allocated(), tiling.tiles[1].allocated()],
            accumulators: i64::from(state.accumulators()),
            split_k: state.split_k,
            semaphores: 0,
            scope: self.scope,
            body,
            launch,
            shared: SharedPool::FloatTiles,
            staging: None,
        }
    }

    /// One shared-memory stage at the given per-axis stage coordinates: both inputs'
    /// cooperative fetch, a barrier, the inner product, a barrier.
    fn stage(
        &mut self,
        out: &mut Vec<Stmt>,
        block_base: &[Expr],
        stage_coords: &[Expr],
        thread: &[Expr],
    ) {
        let stage_base: Vec<Expr> = stage_coords
            .iter()
            .zip(&self.tiling.stage_tile)
            .map(|(v, &t)| self.scope.mul(v.clone(), t))
            .collect();
        for input in 0..2 {
            self.fetch(out, input, block_base, &stage_base);
        }
        out.push(Stmt::Sync);
        out.extend(self.compute(thread));
        out.push(Stmt::Sync);
    }

    /// The stage loop of a split-K block with split coordinate `z`: flattened stages
    /// `z * chunk + ro` for `ro` in `0..chunk` (`chunk = ceil(stages / split_k)`, see
    /// `state::stage_chunk`), those past the last stage skipped by a branch that is
    /// uniform over the block.
    fn split_stages(&mut self, z: Expr, block_base: &[Expr], thread: &[Expr]) -> Vec<Stmt> {
        let c = self.c;
        let stages: i64 = self.tiling.stages.iter().product();
        let chunk = (stages + i64::from(self.state.split_k) - 1) / i64::from(self.state.split_k);
        let ro = self.loop_var("ro", chunk);
        let flat = self.scope.add(self.scope.mul(z, chunk), var_or_zero(ro));
        let tail = self.scope.bound(&flat, 0, stages);
        // Bound inside the guard, where it is known to be below `stages`: the per-axis
        // decomposition then needs no remainder on its outermost axis.
        let mut stage = Vec::new();
        let flat = if matches!(flat, Expr::Const(_) | Expr::Var(_)) {
            flat
        } else {
            let (lo, hi) = self.scope.range(&flat);
            let var = self.scope.var("ro_flat", lo, hi.min(stages - 1));
            stage.push(Stmt::Let { var, value: flat });
            Expr::Var(var)
        };
        let names: Vec<String> = c
            .reduction
            .iter()
            .map(|a| format!("ro_{}", a.name))
            .collect();
        let extents = self.tiling.stages.clone();
        let coords = self.decompose(&mut stage, flat, &extents, &names);
        self.stage(&mut stage, block_base, &coords, thread);
        let iteration = match tail {
            None => stage,
            Some(tail) => vec![Stmt::If {
                conds: vec![tail],
                body: stage,
            }],
        };
        wrap_loops(&[ro], &[chunk], |_| false, iteration)
    }

    /// The cooperative fetch of one input's stage tile into shared memory.
    fn fetch(
        &mut self,
        out: &mut Vec<Stmt>,
        input: usize,
        block_base: &[Expr],
        stage_base: &[Expr],
    ) {
        let access = &self.c.inputs[input];
        let tile = &self.tiling.tiles[input];
        let width = i64::from(self.state.vector_width[input]);
        let threads = self.scope.threads;
        let vectors = tile.elements() / width;
        let rounds = self.tiling.fetch_rounds(input, self.state);
        let tensor = access.tensor;
        let round = self.loop_var(&format!("{tensor}_round"), rounds);
        let unroll = fetch_unrolled(rounds, width, self.state);
        let mut inner = Vec::new();
        let vector = self
            .scope
            .add(self.scope.mul(var_or_zero(round), threads), Expr::ThreadIdx);
        let vector = self.bind(&mut inner, &format!("{tensor}_v"), vector);
        let element = self.scope.mul(vector.clone(), width);
        let mut body = Vec::new();
        let names: Vec<String> = (0..tile.shape.len())
            .map(|d| format!("{tensor}_d{d}"))
            .collect();
        let coords = self.decompose(&mut body, element.clone(), &tile.shape, &names);
        let mut valid = Vec::new();
        let mut global = Expr::Const(0);
        for (d, (index, stride)) in access.index.iter().zip(access.strides()).enumerate() {
            // Global index of this dimension: the affine index at the tile's base,
            // plus the coordinate within the box.
            let base = affine_terms(&self.scope, index, block_base, stage_base);
            let g = self.scope.add(
                self.scope.add(base, Expr::Const(index.offset)),
                coords[d].clone(),
            );
            let g = self.bind(&mut body, &format!("{tensor}_g{d}"), g);
            valid.extend(self.scope.bound(&g, 0, i64::from(access.shape[d])));
            global = self.scope.add(global, self.scope.mul(g, stride));
        }
        // Where the vector lands in shared memory: through the layout's strides, or at
        // its position in the row-major box when the layout is the tensor's own order.
        let strides = tile.strides();
        let shared = if tile.is_natural() {
            element
        } else {
            let s = &self.scope;
            s.sum(
                coords
                    .iter()
                    .zip(&strides)
                    .map(|(x, &st)| s.mul(x.clone(), st)),
            )
        };
        body.push(Stmt::Fetch {
            read: GlobalRead {
                input,
                at: global,
                valid,
                width: width as u32,
            },
            write: SharedWrite {
                input,
                at: shared,
                width: width as u32,
                step: strides.last().copied().unwrap_or(1),
                vector: tile.vector_store(width),
            },
        });
        guarded(
            &mut inner,
            self.scope.bound(&vector, 0, vectors),
            body,
            false,
        );
        out.extend(wrap_loops(&[round], &[rounds], |_| unroll, inner));
    }

    /// Middle and inner reduction loops around the whole register tile's
    /// multiply-accumulates: each reduction step is one outer product, so every operand
    /// value loaded from shared memory is reused across the tile and the live registers
    /// are the accumulators plus one step's operands.
    fn compute(&mut self, thread: &[Expr]) -> Vec<Stmt> {
        let c = self.c;
        let state = self.state;
        let middle_extents: Vec<i64> = state
            .reduction
            .iter()
            .map(|r| i64::from(r.middle))
            .collect();
        let inner_extents: Vec<i64> = state.reduction.iter().map(|r| i64::from(r.inner)).collect();
        let middle: Vec<Option<Var>> = (0..c.reduction.len())
            .map(|r| self.loop_var(&format!("rm_{}", c.reduction[r].name), middle_extents[r]))
            .collect();
        let inner: Vec<Option<Var>> = (0..c.reduction.len())
            .map(|r| self.loop_var(&format!("ri_{}", c.reduction[r].name), inner_extents[r]))
            .collect();
        let reg = self.register_loops("");

        // Local reduction index within the stage: middle * inner_extent + inner.
        let local_red: Vec<Expr> = (0..c.reduction.len())
            .map(|r| {
                let m = self.scope.mul(var_or_zero(middle[r]), inner_extents[r]);
                self.scope.add(m, var_or_zero(inner[r]))
            })
            .collect();
        let local_sp = self.local_spatial(thread, &reg);
        let [a, b] = [0, 1].map(|i| self.tile_offset(&c.inputs[i], i, &local_sp, &local_red));
        let acc = self.acc_index(&reg);

        let unroll = ReductionUnroll::of(state);
        let stmt = vec![Stmt::Fma { acc, a, b }];
        let (reg_vars, reg_ext) = self.register_nest(&reg);
        let body = wrap_loops(&reg_vars, &reg_ext, |_| true, stmt);
        let body = wrap_loops(&inner, &inner_extents, |_| unroll.inner, body);
        wrap_loops(&middle, &middle_extents, |_| unroll.middle, body)
    }

    fn register_extents(&self) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
        let s = &self.state.spatial;
        (
            s.iter().map(|x| i64::from(x.vthread)).collect(),
            s.iter().map(|x| i64::from(x.outer)).collect(),
            s.iter().map(|x| i64::from(x.inner)).collect(),
        )
    }

    /// The loops over a thread's register tile, outermost first: its variables and
    /// extents (virtual threads, outer, inner register factors of every axis).
    fn register_nest(&self, reg: &RegisterLoops) -> (Vec<Option<Var>>, Vec<i64>) {
        let (v, o, i) = self.register_extents();
        let vars = reg
            .vthread_vars
            .iter()
            .chain(&reg.outer_vars)
            .chain(&reg.inner_vars)
            .copied()
            .collect();
        (vars, v.into_iter().chain(o).chain(i).collect())
    }

    /// Fresh loop variables over one thread's register tile.
    fn register_loops(&mut self, suffix: &str) -> RegisterLoops {
        let (v, o, i) = self.register_extents();
        let names: Vec<&'static str> = self.c.spatial.iter().map(|a| a.name).collect();
        let mut make = |prefix: &str, ext: &[i64]| -> Vec<Option<Var>> {
            names
                .iter()
                .zip(ext)
                .map(|(n, &e)| self.loop_var(&format!("{prefix}_{n}{suffix}"), e))
                .collect()
        };
        let vthread_vars = make("v", &v);
        let outer_vars = make("o", &o);
        let inner_vars = make("i", &i);
        RegisterLoops {
            vthread_vars,
            outer_vars,
            inner_vars,
        }
    }

    /// Position within the block tile, per spatial axis:
    /// `((vthread * threads + thread) * outer + o) * inner + i`.
    fn local_spatial(&self, thread: &[Expr], reg: &RegisterLoops) -> Vec<Expr> {
        let s = &self.scope;
        self.state
            .spatial
            .iter()
            .enumerate()
            .map(|(a, split)| {
                let x = s.add(
                    s.mul(var_or_zero(reg.vthread_vars[a]), i64::from(split.thread)),
                    thread[a].clone(),
                );
                let x = s.add(
                    s.mul(x, i64::from(split.outer)),
                    var_or_zero(reg.outer_vars[a]),
                );
                s.add(
                    s.mul(x, i64::from(split.inner)),
                    var_or_zero(reg.inner_vars[a]),
                )
            })
            .collect()
    }

    /// Offset within input `i`'s shared tile of the element at the given local indices.
    fn tile_offset(
        &self,
        access: &Access,
        i: usize,
        local_sp: &[Expr],
        local_red: &[Expr],
    ) -> Expr {
        let s = &self.scope;
        let strides = self.tiling.tiles[i].strides();
        s.sum(access.index.iter().zip(strides).map(|(index, stride)| {
            let within = affine_terms(s, index, local_sp, local_red);
            s.mul(within, stride)
        }))
    }

    /// Accumulator index: row-major over axes of `(vthread * outer + o) * inner + i`.
    fn acc_index(&self, reg: &RegisterLoops) -> Expr {
        let s = &self.scope;
        let mut acc = Expr::Const(0);
        for (a, split) in self.state.spatial.iter().enumerate() {
            let x = s.add(
                s.mul(var_or_zero(reg.vthread_vars[a]), i64::from(split.outer)),
                var_or_zero(reg.outer_vars[a]),
            );
            let x = s.add(
                s.mul(x, i64::from(split.inner)),
                var_or_zero(reg.inner_vars[a]),
            );
            acc = s.add(s.mul(acc, i64::from(split.register_tile())), x);
        }
        acc
    }

    /// Writes each thread's register tile through the epilogue; under split-K (`split`
    /// is the block's split coordinate) adds it into the output atomically, the bias
    /// from chunk 0 only.
    fn store(&mut self, block_base: &[Expr], thread: &[Expr], split: Option<&Expr>) -> Vec<Stmt> {
        let c = self.c;
        let reg = self.register_loops("_out");
        let local = self.local_spatial(thread, &reg);
        let acc = self.acc_index(&reg);
        let mut body = Vec::new();
        let mut valid = Vec::new();
        let mut out = Expr::Const(0);
        let mut coords = Vec::new();
        for (a, stride) in c.output_strides().into_iter().enumerate() {
            let o = self.scope.add(block_base[a].clone(), local[a].clone());
            let o = self.bind(&mut body, &format!("out_{}", c.spatial[a].name), o);
            valid.extend(self.scope.bound(&o, 0, i64::from(c.spatial[a].extent)));
            out = self.scope.add(out, self.scope.mul(o.clone(), stride));
            coords.push(o);
        }
        body.push(epilogue_store(
            &self.scope,
            c,
            &coords,
            split,
            (acc, out, valid, 1),
            false,
        ));
        let (vars, extents) = self.register_nest(&reg);
        wrap_loops(&vars, &extents, |_| true, body)
    }
}

/// Loop variables over one thread's register tile, per spatial axis (None: extent 1).
struct RegisterLoops {
    vthread_vars: Vec<Option<Var>>,
    outer_vars: Vec<Option<Var>>,
    inner_vars: Vec<Option<Var>>,
}
