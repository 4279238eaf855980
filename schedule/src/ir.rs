//! The loop-nest IR that a state lowers to: loops, barriers, and the few statements a
//! tiled contraction needs, over integer index expressions (`expr`, re-exported here),
//! plus the register arrays and C blocks that transform passes (`prefetch`) build. CUDA
//! code generation prints it; the CPU interpreter executes it. Expressions are built
//! through `Scope`, which knows every variable's range and simplifies as it builds, so
//! that the generated code and the predicates stay as small as the shape allows.

pub use crate::expr::{Cond, Expr, Scope, Var, VarInfo};

/// Blocks of a cluster by rank: `first` plus the position of each set bit of
/// `pattern` (where a copy multicasts to, or on whose barriers a thread arrives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranks {
    pub first: Expr,
    pub pattern: u16,
}

impl Ranks {
    /// The ranks for `first`'s value.
    pub fn of(&self, first: i64) -> Vec<usize> {
        (0..16)
            .filter(|bit| self.pattern >> bit & 1 == 1)
            .map(|bit| (first + bit) as usize)
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    /// `const int var = value;`
    Let { var: Var, value: Expr },
    /// `const int var = __shfl_sync(0xffffffff, value, 0);`: a `value` the same on every
    /// lane of a warp (it depends on the thread only through its warp), broadcast from
    /// lane 0 so that the compiler can prove it, and branches on it are not divergent.
    WarpUniform { var: Var, value: Expr },
    /// Warp specialization: each part (an `If` over disjoint sets of whole warps) runs
    /// its own code path, concurrently with the others, and the parts wait for each
    /// other only through mbarriers. Printed as the parts one after another. Separate
    /// paths keep warpgroup MMAs out of branches shared with other roles: ptxas
    /// serializes `wgmma` in a loop where a producer's branch sits beside them (its
    /// C7518), which made states with a producer warp 7-30% slower than without.
    Concurrent { parts: Vec<Stmt> },
    /// `for (var = 0; var < extent; ++var)`; `unroll` asks the compiler to unroll fully,
    /// otherwise the loop is kept rolled.
    For {
        var: Var,
        extent: i64,
        unroll: bool,
        body: Vec<Stmt>,
    },
    /// Runs `body` for the threads that satisfy every condition.
    If { conds: Vec<Cond>, body: Vec<Stmt> },
    /// Block-wide barrier.
    Sync,
    /// Sets every accumulator to zero.
    ZeroAcc,
    /// `write` ← `read`: one vector load from global memory into the shared tile.
    Fetch {
        read: GlobalRead,
        write: SharedWrite,
    },
    /// `float{width} pf{array}[len];` (`float` when `width` is 1): a per-thread array of
    /// `len` register vectors, unwritten until a `RegisterLoad` fills a slot. Like any C
    /// declaration it lives until the end of the enclosing body.
    Registers { array: usize, width: u32, len: i64 },
    /// `pf{array}[slot]` ← `read`: the global half of a `Fetch`, kept in registers
    /// (register prefetch, see `prefetch`). `slot` must be a compile-time constant once
    /// unrolled (the fetch loops around it are), or the array would leave the registers.
    RegisterLoad {
        array: usize,
        slot: Expr,
        read: GlobalRead,
    },
    /// `write` ← `pf{array}[slot]`: the shared half of a `Fetch`, from the registers a
    /// `RegisterLoad` filled.
    RegisterStore {
        array: usize,
        slot: Expr,
        write: SharedWrite,
    },
    /// `{ body }`: a C block. Every binding made inside it (`Let`, loop counters,
    /// `Registers`) ends with it, including a `Let` that shadows a variable bound
    /// outside (the prefetch's `const int ro = ro_next;` that re-evaluates a stage's
    /// addresses for the next stage).
    Block { body: Vec<Stmt> },
    /// `acc[acc] += tile0[a] * tile1[b]` (offsets within each input's shared tile).
    Fma { acc: Expr, a: Expr, b: Expr },
    /// Tensor-core sketch (`lower::mma_sync`). `write` ← `read` by `cp.async` (the
    /// write contiguous: `step` 1), zero-filled where the read is invalid; lands at a
    /// `WaitGroup`, is seen by other threads after the next barrier. A copy of one
    /// 2-byte element is an ordinary load and store, which the interpreter treats
    /// alike.
    AsyncCopy {
        read: GlobalRead,
        write: SharedWrite,
    },
    /// `cp.async.commit_group`: the thread's copies since the last commit form a group.
    CommitGroup,
    /// `cp.async.wait_group pending`: all but the `pending` newest groups have landed.
    WaitGroup { pending: u32 },
    /// Loads MMA operand fragment `frag` of input `input` for one k-step: the A
    /// operand (input 0) is tile rows `row..row+16`, columns `k..k+k_step`; a K-major
    /// B operand is rows `row..row+8` (its N), columns `k..`; an N-major B operand is
    /// rows `k..k+k_step`, columns `row..row+8`. Element positions go through `layout`
    /// from `base`, the stage's first element. Semantically every lane holds the
    /// whole fragment; the printed code distributes it as `ldmatrix` does. `count`
    /// consecutive fragments are loaded at once (`frag..frag+count`, each 16 or 8
    /// rows further): two B fragments make one `ldmatrix.x4`. An A operand of row
    /// spans (`OperandLayout::Span`) is printed as one 32-bit shared load per register
    /// (its pair of k), which must start at an even element.
    LoadFragment {
        input: usize,
        frag: usize,
        count: usize,
        base: Expr,
        row: Expr,
        k: Expr,
        layout: crate::atom::OperandLayout,
        k_step: i64,
        k_major: bool,
    },
    /// `mma.sync` m16n8k{k_step}: accumulators `acc..acc+4` of each thread (its
    /// elements of the 16×8 product tile as PTX lays them out: rows `lane/4` and
    /// `lane/4 + 8`, columns `2*(lane%4)` and `+1`) += fragment `a` × fragment `b`.
    Mma { acc: i64, a: usize, b: usize },
    /// Hopper's copies and their barriers (the `wgmma` sketch). `mbarrier.init`:
    /// barrier `barrier` of the block (8 bytes of shared memory each) expects
    /// `arrivals` arrivals per phase. One thread runs it; a block barrier
    /// publishes it.
    MbarrierInit { barrier: Expr, arrivals: u32 },
    /// `mbarrier.arrive.expect_tx`: one arrival on `barrier`, whose current phase then
    /// also waits for `bytes` more bytes from copies.
    ArriveExpectTx { barrier: Expr, bytes: i64 },
    /// `cp.async.bulk.tensor`: the box of the tensor map `params[map]` (a
    /// `Param::TensorMap`) at `coords` (innermost first; an im2col map's filter offsets
    /// after its tensor coordinates, `TensorBox::elements`) into its input's shared tile
    /// from element `at`, as the box lays itself out; its bytes complete on `barrier`.
    /// Elements outside the tensor are zeros. With `multicast`, the box lands at the
    /// same place in each of those blocks of the cluster and completes on each one's
    /// `barrier`.
    TmaLoad {
        map: usize,
        coords: Vec<Expr>,
        at: Expr,
        barrier: Expr,
        multicast: Option<Ranks>,
    },
    /// Waits until the phase of `barrier` with parity `parity` has completed
    /// (`mbarrier.try_wait.parity` in a loop); the copies that completed it are then
    /// visible to the waiting threads.
    MbarrierWait { barrier: Expr, parity: Expr },
    /// `mbarrier.arrive`: one arrival of each active thread on `barrier` (a consumer
    /// releasing a buffer); what the thread knows to be complete (its warpgroup's
    /// retired MMAs) becomes known to every thread that waits for that phase.
    MbarrierArrive { barrier: Expr },
    /// One arrival of each active thread on `barrier` of each of those blocks of its
    /// cluster (`mapa`, then `mbarrier.arrive.shared::cluster`): a consumer releasing
    /// a buffer that their producers multicast into. Each barrier must have been
    /// published to the cluster (`ClusterSync`).
    ClusterArrive { barrier: Expr, ranks: Ranks },
    /// A barrier of every thread of the cluster (`barrier.cluster.arrive.release` and
    /// `wait.acquire`), after a fence that publishes the blocks' initialized mbarriers
    /// to the cluster: before any block may arrive on or copy into another, and before
    /// any block exits while another may still do so.
    ClusterSync,
    /// `wgmma.fence`: the warpgroup's earlier writes of its accumulator registers (their
    /// zeroing) are ordered before the warpgroup MMAs that follow.
    WgmmaFence,
    /// `wgmma.mma_async` m64n{n}k16, issued by whole warpgroups: each thread's
    /// accumulators `acc..acc + n/2` (`WgmmaAtom::accumulator`'s layout) += A × B, A the
    /// 64 × 16 operand and B the 16 × n one, read from shared memory through their
    /// descriptors. Its results and its reads of shared memory complete at the
    /// `WgmmaWait` that retires its group.
    Wgmma {
        acc: i64,
        n: i64,
        a: WgmmaOperand,
        b: WgmmaOperand,
    },
    /// `wgmma.commit_group`: the warpgroup's MMAs since the last commit form a group.
    WgmmaCommit,
    /// `wgmma.wait_group pending`: all but the `pending` newest groups have completed.
    WgmmaWait { pending: u32 },
    /// Split-K through scratch (`lower::common::split_fixup`): `if (valid)
    /// partial[at] = acc[acc]`, a block's partial sum of one accumulator into its own
    /// slot of the workspace; `atomic`, `atomicAdd(&partial[at], acc[acc])` instead, added
    /// into its output tile's sum (a reduction done in L2, where every chunk's sums
    /// meet in one slot).
    PartialStore {
        acc: Expr,
        at: Expr,
        valid: Vec<Cond>,
        atomic: bool,
    },
    /// `if (valid) acc[acc] += partial[at]`, read past the L1 cache (`ld.global.cg`):
    /// the fixup adding a partial sum that arrivals published; `clear` also zeroes the
    /// slot (`st.global.cg`), as a slot that atomics add into must start the next
    /// launch at zero.
    PartialAdd {
        acc: Expr,
        at: Expr,
        valid: Vec<Cond>,
        clear: bool,
    },
    /// Each warp (whole warps only) publishes its partial stores (`__threadfence`) and
    /// adds `weight` (warp-uniform, positive) to workspace semaphore `counter`; the warp
    /// whose addition brings it to `arrivals` resets the semaphore to zero and runs
    /// `body`, having seen every store the arrivals published. The others skip it.
    /// (A split counts arrivals, weight 1; stream-K counts K tiles, as a tile's blocks
    /// each cover a run of them.)
    LastArrival {
        counter: Expr,
        arrivals: u32,
        weight: Expr,
        body: Vec<Stmt>,
    },
    /// `fence.proxy.async.shared::cta`: the thread's earlier writes of shared memory
    /// become visible to the async proxy, so that a TMA store may read them.
    FenceProxyAsync,
    /// `bar.sync id, threads`: a barrier of the `threads` threads (whole warps) that
    /// name the same `id` (a warpgroup's own: 1 + its index, 0 being the block's).
    NamedSync { id: Expr, threads: u32 },
    /// `cp.async.bulk.tensor` from shared memory, then `cp.async.bulk.commit_group`: the
    /// box of the output's tensor map `params[map]` at `coords` (innermost first),
    /// from the staging buffers (`Kernel::staging`) at element `from`, laid out as the
    /// box lays itself out; elements outside the tensor are not written. It reads
    /// shared memory asynchronously, until a `BulkWait` of its thread retires it.
    TmaStore {
        map: usize,
        coords: Vec<Expr>,
        from: Expr,
    },
    /// `cp.async.bulk.wait_group.read pending`: all but the thread's `pending` newest
    /// TMA stores have finished reading shared memory.
    BulkWait { pending: u32 },
    /// `if (valid) out[out] = epilogue(acc[acc] (+ bias[bias]))`; with `atomic`,
    /// `if (valid) atomicAdd(&out[out], acc[acc] (+ bias[bias]))` instead (split-K: the
    /// blocks of one output tile add their partial sums into the zeroed output). The
    /// bias is added only where every condition of `bias_when` holds (always when it
    /// is empty), so that exactly one of the blocks adding into an element adds it.
    /// With `width` 2, accumulators `acc` and `acc + 1` go to output elements `out` and
    /// `out + 1` (with bias elements `bias` and `bias + 1`) as one aligned store; `valid`
    /// then covers both. With `staged`, `out` is an element of the staging buffers
    /// (`Kernel::staging`), which a `TmaStore` then writes to the output, rather than
    /// of the output.
    Store {
        acc: Expr,
        out: Expr,
        bias: Option<Expr>,
        bias_when: Vec<Cond>,
        valid: Vec<Cond>,
        atomic: bool,
        width: u32,
        staged: bool,
    },
}

/// One operand of a warpgroup MMA: the descriptor of input `input`'s shared tile at byte
/// `start` of that tile (its pool offset added when printed), laid out as `layout` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgmmaOperand {
    pub input: usize,
    pub start: Expr,
    pub layout: crate::atom::wgmma::OperandLayout,
}

/// The source of every copy statement: `width` consecutive elements of input `input`
/// from global memory at `at`, zeros where a condition of `valid` fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalRead {
    pub input: usize,
    pub at: Expr,
    pub valid: Vec<Cond>,
    pub width: u32,
}

/// The destination of every copy into shared memory: element `j` of `width` goes to
/// input `input`'s shared tile at `at + j * step`, stored as one vector when `vector`
/// (then `step` is 1 and the address aligned), else component by component (a shared
/// layout whose contiguous dimension is not the vector's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedWrite {
    pub input: usize,
    pub at: Expr,
    pub width: u32,
    pub step: i64,
    pub vector: bool,
}

impl SharedWrite {
    /// Whether the vector is stored component by component.
    pub fn scattered(&self) -> bool {
        self.width > 1 && !self.vector
    }
}

impl Stmt {
    /// The copy a statement makes: what it reads from global memory and what it writes
    /// into shared memory (one side only for the register halves of a fetch).
    pub fn copy(&self) -> Option<(Option<&GlobalRead>, Option<&SharedWrite>)> {
        match self {
            Stmt::Fetch { read, write } | Stmt::AsyncCopy { read, write } => {
                Some((Some(read), Some(write)))
            }
            Stmt::RegisterLoad { read, .. } => Some((Some(read), None)),
            Stmt::RegisterStore { write, .. } => Some((None, Some(write))),
            _ => None,
        }
    }

    /// The statements nested directly in this one (a loop's, a branch's, a block's).
    pub fn body(&self) -> &[Stmt] {
        match self {
            Stmt::For { body, .. }
            | Stmt::If { body, .. }
            | Stmt::Block { body }
            | Stmt::LastArrival { body, .. } => body,
            Stmt::Concurrent { parts } => parts,
            _ => &[],
        }
    }

    /// The statements nested directly in this one, to edit (None when there are none).
    pub fn body_mut(&mut self) -> Option<&mut Vec<Stmt>> {
        match self {
            Stmt::For { body, .. }
            | Stmt::If { body, .. }
            | Stmt::Block { body }
            | Stmt::LastArrival { body, .. }
            | Stmt::Concurrent { parts: body } => Some(body),
            _ => None,
        }
    }

    /// Visits every statement of `body` and of the bodies nested in it, in order.
    pub fn walk(body: &[Stmt], visit: &mut impl FnMut(&Stmt)) {
        for s in body {
            visit(s);
            Stmt::walk(s.body(), visit);
        }
    }
}

/// What a tensor parameter is to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Input `i` of the contraction (read-only).
    Input(usize),
    /// The bias (read-only).
    Bias,
    /// The output (written, or added into under split-K).
    Output,
}

/// One kernel parameter, in launch order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// A device pointer to a tensor of `dtype` elements.
    Buffer {
        name: &'static str,
        role: Role,
        dtype: crate::task::DType,
    },
    /// The launch's scratch (`LaunchConfig::workspace_bytes`): `Kernel::semaphores`
    /// 32-bit counters, then, 16-byte aligned, f32 partial sums.
    Workspace { name: &'static str },
    /// A 128-byte `CUtensorMap` passed by value (`__grid_constant__`): the TMA view
    /// `tensor` of input `input`, whose boxes `Stmt::TmaLoad` copies, or with `input`
    /// `OUTPUT_MAP`, of the output, whose boxes `Stmt::TmaStore` writes.
    TensorMap {
        name: &'static str,
        input: usize,
        tensor: crate::atom::tma::TensorBox,
    },
}

/// `Param::TensorMap::input` of the output's tensor map.
pub const OUTPUT_MAP: usize = 2;

/// How a kernel declares its shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedPool {
    /// A pool split into one `float` tile per input (`{name}_sh`), half data widened as
    /// it is fetched (the CUDA-core sketch).
    FloatTiles,
    /// One pool of the inputs' own element type, addressed in bytes from `shared_base`
    /// for `cp.async` and `ldmatrix`, with the MMA fragments' registers (the
    /// tensor-core sketch).
    Typed,
}

/// A lowered kernel: the loop nest and everything needed to launch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    pub scope: Scope,
    /// The parameters in launch order.
    pub params: Vec<Param>,
    /// Element types of the inputs (and bias) and of the output.
    pub dtype: crate::task::DType,
    pub out_dtype: crate::task::DType,
    /// The epilogue's ReLU.
    pub relu: bool,
    /// Offset (in floats) of each input's tile in the shared pool.
    pub tile_offsets: [i64; 2],
    /// Floats each input's tile occupies in the pool (its row padding included).
    pub tile_elements: [i64; 2],
    pub accumulators: i64,
    /// Blocks that add into each output element (the state's `split_k`); 1 when the
    /// epilogue stores rather than adds.
    pub split_k: u32,
    /// Semaphores at the start of the workspace (0 without one).
    pub semaphores: i64,
    pub body: Vec<Stmt>,
    pub launch: crate::launch::LaunchConfig,
    pub shared: SharedPool,
    /// The epilogue's staging buffers in the typed pool, for TMA stores; None when the
    /// epilogue stores straight from registers.
    pub staging: Option<Staging>,
}

/// Shared memory that an epilogue stages its results in (output elements) before TMA
/// stores write them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Staging {
    /// Byte offset in the pool (1024-aligned, for the 128-byte swizzle).
    pub offset: i64,
    /// Output elements.
    pub elements: i64,
}

/// Byte offset of the partial sums in a workspace that starts with `semaphores` 32-bit
/// counters: the next 16-byte boundary.
pub fn partials_offset(semaphores: i64) -> i64 {
    (semaphores * 4 + 15) / 16 * 16
}

/// Bytes of a split-K workspace: `semaphores` counters, then `partial_sums` f32 values
/// from the next 16-byte boundary.
pub fn workspace_bytes(semaphores: u64, partial_sums: u64) -> u64 {
    partials_offset(semaphores as i64) as u64 + 4 * partial_sums
}

impl Kernel {
    /// The mbarriers the body uses: one more than the highest index it can name.
    pub fn barriers(&self) -> usize {
        let mut count = 0;
        Stmt::walk(&self.body, &mut |s| {
            if let Stmt::MbarrierInit { barrier, .. }
            | Stmt::ArriveExpectTx { barrier, .. }
            | Stmt::TmaLoad { barrier, .. }
            | Stmt::MbarrierWait { barrier, .. }
            | Stmt::MbarrierArrive { barrier }
            | Stmt::ClusterArrive { barrier, .. } = s
            {
                let highest = self.scope.range(barrier).1;
                count = count.max(usize::try_from(highest + 1).unwrap_or(0));
            }
        });
        count
    }

    /// The tensor map parameter `params[map]` that a TMA load names: its name, its
    /// input and its box.
    pub fn tensor_map(&self, map: usize) -> (&'static str, usize, &crate::atom::tma::TensorBox) {
        match self.params.get(map) {
            Some(Param::TensorMap {
                name,
                input,
                tensor,
            }) => (name, *input, tensor),
            _ => panic!("parameter {map} of {} is not a tensor map", self.name),
        }
    }

    /// The name of input `i`'s parameter.
    pub fn input(&self, i: usize) -> &'static str {
        self.params
            .iter()
            .find_map(|p| match p {
                Param::Buffer {
                    name,
                    role: Role::Input(j),
                    ..
                } if *j == i => Some(*name),
                _ => None,
            })
            .expect("a kernel has a parameter per input")
    }
}
