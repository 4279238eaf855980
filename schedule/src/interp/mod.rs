//! A CPU interpreter of lowered kernels, and the naive definition they must match.
//!
//! The interpreter runs every block of the grid; within a block it executes the loop
//! nest once in lockstep for all threads (loops have uniform bounds; `If` narrows the
//! set of active threads). It checks what a GPU would not: every global read is in
//! bounds, every shared read was written in the current barrier interval by the
//! fetch, no thread overwrites a shared element another thread read since the last
//! barrier (a missing `__syncthreads`), no barrier is reached by only some threads, and
//! every output element is written exactly once — or, for a split-K kernel, added into
//! exactly `split_k` times. A split-K kernel's output starts zeroed (as the launch's
//! `zero_output` asks) and its atomic stores add, in the interpreter's block order; with
//! small-integer data every order gives the same sums, so the result is exact. A branch
//! that no thread of a block takes is skipped whole (as on the GPU, where a uniform
//! branch around a barrier is legal). Tests compare its output with `reference`, the
//! contraction evaluated straight from its definition.
//!
//! Hopper's TMA copies land in shared memory when their mbarrier phase completes
//! (`mbarrier`: arrivals and transaction bytes balance), zero-filled outside the tensor
//! and laid out as the box says; a thread may read them once it has waited for that
//! phase. A wait that can never be satisfied, a wait of the wrong parity and a read
//! before the wait are errors, as is an mbarrier initialized by more than one thread.
//!
//! A warpgroup MMA (`wgmma`) runs for whole warpgroups only. It reads its operands where
//! their descriptors say the hardware finds them (`atom::wgmma::OperandLayout`, then the
//! address swizzle), and only what TMA wrote in a phase every thread of the warpgroup
//! waited for. Its results are pending until a `wait_group` retires its group, and
//! reading them before that is an error, as is an MMA on accumulators written since the
//! last `wgmma.fence`. A shared element an MMA read may be overwritten only by a thread
//! that knows the MMA's group retired: its own warpgroup's `wait_group`, a block
//! barrier, or an mbarrier phase it waited for, whose arrivals released that knowledge
//! (a consumer's release of a buffer). Otherwise the write is a race.
//!
//! Warp-specialized parts (`Stmt::Concurrent`) run concurrently: each part's loop nest is
//! flattened into a program with its own position, and the parts take turns, each
//! running until it finishes or reaches an mbarrier wait whose phase has not completed
//! (it retries there on its next turn), in a fixed order. When every unfinished part
//! waits, no part can make progress: a deadlock, reported as that wait's error.
//!
//! Thread-block clusters run together: the blocks of a cluster are one set of threads
//! in lockstep, each block's shared tiles and mbarriers its own. A multicast copy lands
//! in the tile of each block it names and completes on each one's barrier, and a
//! cluster arrival arrives on each named block's (a rank outside the cluster is an
//! error); a barrier of another block may be used only once a
//! cluster barrier published it, and a block barrier tells only what its own
//! warpgroups completed, so a producer that refills another block's buffer must have
//! learnt through the arrivals on its empty barrier that that block's MMAs retired.
//!
//! Split-K through scratch (`Stmt::LastArrival`): the workspace outlives the blocks,
//! which run in grid order, so a tile's last arrival is its last block's. Partial sums
//! are stored to a chunk's own slots, or added into a tile's sums (atomically on the
//! GPU); a warp's arrival publishes the ones it stored or added before it, and a fixup
//! may read only a slot whose every store or addition an arrival on the semaphore it is
//! the last arrival of published (one made after its warp arrived, or never made, is
//! an error). Every semaphore, and every slot atomics added into, must be back at zero
//! when the launch ends, as the next launch expects them.
//!
//! It runs the nest exactly as it is printed, transforms included (register prefetch,
//! see `prefetch`): register arrays are per thread, and reading a slot that no load
//! filled since the array's declaration is an error; register loads check global
//! bounds like a fetch, register stores go through the same shared-memory race and
//! initialization bookkeeping. A `Block` is a C scope: the bindings made inside it (a
//! `Let` shadowing a loop counter, loop counters, register arrays) end with it, and
//! whatever they shadowed is visible again. (Other bodies bind only variables that are
//! unique in the kernel, so they need no restoring.)
//!
//! This file runs the grid's blocks and their threads: loops, shared and global memory,
//! registers, block barriers, `mma.sync`. By concern, the rest: `tma` (mbarriers and
//! TMA copies), `warpgroup` (warpgroup MMAs), `parts` (warp-specialized parts), `split`
//! (split-K through scratch) and `reference` (the definition).

mod parts;
mod reference;
mod split;
mod tma;
mod warpgroup;

use parts::flatten;
pub use reference::reference;

use crate::atom::wgmma::{FP16_M64K16, WgmmaAtom, swizzle_address};
use crate::atom::{MmaAtom, OperandLayout};
use crate::ir::{Cond, Expr, GlobalRead, Kernel, Ranks, SharedWrite, Stmt, Var, WgmmaOperand};
use crate::mbarrier::{Mbarrier, WaitError};
use crate::staging::{Staging, StagingError};
use crate::task::Contraction;
use thiserror::Error;

/// A kernel that would misbehave on the GPU.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum InterpError {
    #[error(
        "block {block} thread {thread}: a value broadcast from lane 0 differs on this lane (not warp-uniform)"
    )]
    NotWarpUniform { block: usize, thread: usize },
    #[error("block {block} thread {thread}: read of {tensor}[{index}] outside its {len} elements")]
    OutOfBounds {
        block: usize,
        thread: usize,
        tensor: &'static str,
        index: i64,
        len: usize,
    },
    #[error(
        "block {block}: shared element {index} of tile {tile} read before it was fetched in this stage"
    )]
    Uninitialized {
        block: usize,
        tile: usize,
        index: i64,
    },
    #[error(
        "block {block}: shared element {index} of tile {tile} written while another thread may still read it (missing barrier)"
    )]
    Race {
        block: usize,
        tile: usize,
        index: i64,
    },
    #[error("block {block}: barrier inside a branch that not all threads take")]
    DivergentBarrier { block: usize },
    #[error("output element {index} written {count} times, expected {expected}")]
    OutputWrites {
        index: usize,
        count: u32,
        expected: u32,
    },
    #[error("accumulator index {index} outside 0..{len}")]
    Accumulator { index: i64, len: i64 },
    #[error("block {block} thread {thread}: register pf{array}[{slot}] read before it was loaded")]
    UnsetRegister {
        block: usize,
        thread: usize,
        array: usize,
        slot: i64,
    },
    #[error(
        "register pf{array}[{slot}] of width {width}: no such slot in a register array declared in scope"
    )]
    RegisterSlot { array: usize, slot: i64, width: u32 },
    #[error(
        "block {block}: shared element {index} of tile {tile} read while its cp.async has not landed (missing wait_group)"
    )]
    AsyncPending {
        block: usize,
        tile: usize,
        index: i64,
    },
    #[error(
        "block {block}: shared element {index} of tile {tile} read before the mbarrier phase that lands it was waited for"
    )]
    TmaPending {
        block: usize,
        tile: usize,
        index: i64,
    },
    #[error("block {block}: mbarrier {barrier} initialized by {threads} threads, not one")]
    MbarrierInit {
        block: usize,
        barrier: usize,
        threads: usize,
    },
    #[error("block {block}: mbarrier {barrier} used before it was initialized")]
    MbarrierUninitialized { block: usize, barrier: usize },
    #[error(
        "block {block}: mbarrier {barrier} of another block of its cluster used before a cluster barrier published it"
    )]
    MbarrierRemote { block: usize, barrier: usize },
    #[error("block {block}: rank {rank} named outside its cluster of {cluster} blocks")]
    ClusterRank {
        block: usize,
        rank: usize,
        cluster: usize,
    },
    #[error("block {block} thread {thread}: mbarrier {barrier}: {problem}")]
    MbarrierWait {
        block: usize,
        thread: usize,
        barrier: usize,
        problem: String,
    },
    #[error("block {block}: mbarrier {barrier} outside the {count} the kernel declares")]
    MbarrierIndex {
        block: usize,
        barrier: i64,
        count: usize,
    },
    #[error("block {block}: a warpgroup instruction run by only part of warpgroup {warpgroup}")]
    PartialWarpgroup { block: usize, warpgroup: usize },
    #[error(
        "block {block} warpgroup {warpgroup}: wgmma on accumulators written since the last wgmma.fence (missing fence)"
    )]
    MissingFence { block: usize, warpgroup: usize },
    #[error(
        "block {block} thread {thread}: accumulator {index} read before the wgmma group writing it completed (missing wait_group)"
    )]
    AccumulatorPending {
        block: usize,
        thread: usize,
        index: usize,
    },
    #[error(
        "block {block}: shared element {index} of tile {tile} read by wgmma, which reads only what TMA wrote and its warpgroup waited for"
    )]
    WgmmaOperand {
        block: usize,
        tile: usize,
        index: i64,
    },
    #[error(
        "block {block} thread {thread}: shared element {index} of tile {tile} overwritten while warpgroup {warpgroup}'s MMAs may still read it (released too early, or not known to be released)"
    )]
    WgmmaRace {
        block: usize,
        thread: usize,
        tile: usize,
        index: i64,
        warpgroup: usize,
    },
    #[error(
        "block {block} thread {thread}: workspace slot {index} read by a fixup before every partial sum stored or added into it was published by an arrival on its semaphore (made after its warp arrived, never made, or cleared already)"
    )]
    PartialUnpublished {
        block: usize,
        thread: usize,
        index: i64,
    },
    #[error("block {block}: semaphore arrival by part of warp {warp}")]
    PartialWarp { block: usize, warp: usize },
    #[error(
        "block {block}: warp {warp} arrives with weight {weight}, not one positive warp-uniform count"
    )]
    ArrivalWeight {
        block: usize,
        warp: usize,
        weight: i64,
    },
    #[error(
        "block {block} thread {thread}: a row-span fragment register's 32-bit shared load starts at odd element {at}"
    )]
    MisalignedPair {
        block: usize,
        thread: usize,
        at: i64,
    },
    #[error(
        "workspace semaphore {semaphore} left at {value} after the launch: its arrivals were miscounted, and the next launch would misread it"
    )]
    SemaphoreLeft { semaphore: usize, value: u32 },
    #[error(
        "workspace sum {index} left non-zero after the launch: no fixup cleared it, and the next launch's atomics would add onto it"
    )]
    PartialLeft { index: usize },
    #[error("block {block}: {error}")]
    Staging { block: usize, error: StagingError },
    #[error("block {block} thread {thread}: an im2col copy at {origin:?} would fault: {problem}")]
    TmaOrigin {
        block: usize,
        thread: usize,
        origin: Vec<i64>,
        problem: &'static str,
    },
    #[error(
        "block {block} thread {thread}: MMA fragment {frag} of input {input} used before it was loaded"
    )]
    UnsetFragment {
        block: usize,
        thread: usize,
        input: usize,
        frag: usize,
    },
}

/// The tensors a kernel reads, in parameter order.
pub struct Inputs<'a> {
    pub inputs: [&'a [f32]; 2],
    pub bias: Option<&'a [f32]>,
}

/// Bookkeeping of one shared element for race detection.
#[derive(Clone, Copy)]
struct Cell {
    value: f32,
    /// Barrier interval in which it was last written, and by whom.
    written: Option<(u64, usize)>,
    /// Barrier interval in which it was last read, and by whom (`usize::MAX`: several).
    read: Option<(u64, usize)>,
    /// Written by a `cp.async` that has not landed yet (its thread has not waited).
    pending: bool,
    /// Written by a `cp.async`: readable from the first barrier after it landed (in
    /// any later interval: a pipeline reads stages filled several barriers ago),
    /// rather than only in the interval right after the fetch.
    asynchronous: bool,
    /// Written by a TMA copy completing on (mbarrier, phase): readable by the threads
    /// that have waited for that phase.
    landed_in: Option<(usize, u64)>,
    /// Last read by warpgroup MMAs: (warpgroup, group), the group counted from 0. It
    /// may be overwritten by a thread that knows that group completed.
    wgmma_read: Option<(usize, u64)>,
}

/// A staging rule broken in block `block`, as the interpreter's error.
fn staging_error(block: usize) -> impl Fn(StagingError) -> InterpError {
    move |error| InterpError::Staging { block, error }
}

/// One slot of partial sums in the workspace: the value stored or the sum of those
/// added into it, how many of those no arrival has published yet, the semaphore whose
/// arrival published the others, and whether atomics added into it (so that it must
/// be cleared before the launch ends).
#[derive(Clone, Copy)]
struct Partial {
    value: f32,
    unpublished: u32,
    published: Option<usize>,
    atomic: bool,
}

/// The launch's scratch, which outlives the blocks: its semaphores, its partial sums,
/// and per (block, warp) the partial sums it stored that no arrival published yet.
#[derive(Default)]
struct Workspace {
    semaphores: Vec<u32>,
    partials: Vec<Option<Partial>>,
    unpublished: std::collections::HashMap<(usize, usize), Vec<usize>>,
}

impl Workspace {
    fn new(kernel: &Kernel) -> Workspace {
        let offset = crate::ir::partials_offset(kernel.semaphores) as u64;
        let bytes = kernel.launch.workspace_bytes.saturating_sub(offset);
        Workspace {
            semaphores: vec![0; kernel.semaphores as usize],
            partials: vec![None; (bytes / 4) as usize],
            unpublished: Default::default(),
        }
    }
}

/// One declared register array (`Stmt::Registers`) of every thread of a block.
#[derive(Clone)]
struct RegisterArray {
    width: u32,
    len: usize,
    /// Per thread, slot and component (row-major); None until loaded.
    values: Vec<Option<f32>>,
}

/// One step of a flattened part of `Stmt::Concurrent`: statements that never wait run
/// whole (`Leaf`); loops, branches and blocks around a wait are taken apart so that the
/// part can stop at the wait and resume there.
#[derive(Clone, Copy)]
enum Op<'k> {
    Leaf(&'k Stmt),
    /// Narrow the threads to those satisfying `conds`; if none does, go to `end`.
    Enter {
        conds: &'k [Cond],
        end: usize,
    },
    Leave,
    /// Start a loop over `var`; an empty one goes to `end`.
    Loop {
        var: Var,
        extent: i64,
        end: usize,
    },
    /// The next iteration from `start`, or past the loop.
    Next {
        var: Var,
        extent: i64,
        start: usize,
    },
    /// A `Block`'s bindings: saved, then restored for this part's threads.
    Scope,
    Unscope,
}

/// A part of `Stmt::Concurrent` being run: its steps, where it is, its threads at each
/// branch depth, its loop counters and its saved bindings.
struct Program<'k> {
    ops: Vec<Op<'k>>,
    pc: usize,
    masks: Vec<Vec<bool>>,
    counters: Vec<i64>,
    saved: Vec<Vec<Vec<i64>>>,
}

impl<'k> Program<'k> {
    fn new(body: &'k [Stmt], active: Vec<bool>) -> Self {
        let mut ops = Vec::new();
        flatten(body, &mut ops);
        Program {
            ops,
            pc: 0,
            masks: vec![active],
            counters: Vec::new(),
            saved: Vec::new(),
        }
    }

    fn done(&self) -> bool {
        self.pc >= self.ops.len()
    }

    fn mask(&self) -> &[bool] {
        self.masks.last().expect("the part's threads")
    }
}

struct Block<'k> {
    kernel: &'k Kernel,
    /// The cluster's index: the blocks of a cluster (`cluster` of them, consecutive)
    /// run together, as one set of threads, `stride` apart per block (each block's
    /// threads rounded up to whole warpgroups; the padding never runs).
    index: usize,
    cluster: usize,
    stride: usize,
    threads: usize,
    env: Vec<Vec<i64>>,
    acc: Vec<Vec<f32>>,
    tiles: [Vec<Cell>; 2],
    interval: u64,
    /// Register arrays in scope, by id.
    registers: Vec<Option<RegisterArray>>,
    /// Per enclosing `Block`, the arrays it declared and what each one shadowed.
    declared: Vec<Vec<(usize, Option<RegisterArray>)>>,
    /// Per thread: the shared cells of its uncommitted `cp.async`s, and its committed
    /// groups oldest first.
    open_group: Vec<Vec<(usize, usize)>>,
    groups: Vec<std::collections::VecDeque<Vec<(usize, usize)>>>,
    /// Per input and thread, the MMA fragments loaded (operand matrices, row-major:
    /// A is 16 × k, B is k × 8).
    fragments: [Vec<Vec<Option<Vec<f32>>>>; 2],
    /// The blocks' mbarriers (block after block), and whether each was published to
    /// the cluster.
    barriers: Vec<Mbarrier>,
    published: Vec<bool>,
    /// The warpgroup MMAs' asynchronous state.
    warpgroups: Warpgroups,
    /// The launch's scratch, lent to each block in turn.
    workspace: Workspace,
    /// Per thread, the semaphore whose last arrival it is running the fixup of.
    acquired: Vec<Option<usize>>,
    /// The epilogue's staging buffers and TMA stores.
    staging: Staging,
}

/// Threads of a warpgroup.
const WARPGROUP: usize = crate::atom::wgmma::WARPGROUP_THREADS as usize;

/// What the interpreter tracks of warpgroup MMAs: per warpgroup the groups committed
/// and completed; per thread which group its accumulators wait for, whether ordinary
/// code wrote them since the last fence, and how many groups of each warpgroup it
/// knows to have completed (its own warpgroup's, every warpgroup's after a block
/// barrier, or what an mbarrier phase it waited for carried).
struct Warpgroups {
    committed: Vec<u64>,
    retired: Vec<u64>,
    pending: Vec<Vec<Option<u64>>>,
    unfenced: Vec<bool>,
    known: Vec<Vec<u64>>,
}

impl Warpgroups {
    fn new(warpgroups: usize, threads: usize, accumulators: usize) -> Warpgroups {
        Warpgroups {
            committed: vec![0; warpgroups],
            retired: vec![0; warpgroups],
            pending: vec![vec![None; accumulators]; threads],
            unfenced: vec![false; threads],
            known: vec![vec![0; warpgroups]; threads],
        }
    }

    /// Groups of each warpgroup that thread `t` knows to have completed.
    fn knowledge(&self, t: usize) -> Vec<u64> {
        let mut known = self.known[t].clone();
        let own = t / WARPGROUP;
        known[own] = known[own].max(self.retired[own]);
        known
    }

    fn learn(&mut self, t: usize, carried: &[u64]) {
        for (k, c) in self.known[t].iter_mut().zip(carried) {
            *k = (*k).max(*c);
        }
    }
}

/// Runs `kernel` on the CPU and returns its output (`out_len` elements).
pub fn run(kernel: &Kernel, inputs: &Inputs, out_len: usize) -> Result<Vec<f32>, InterpError> {
    // Poisoned like the GPU worker's output, unless the launch zeroes it.
    let initial = if kernel.launch.zero_output {
        0.0
    } else {
        f32::NAN
    };
    let mut out = vec![initial; out_len];
    let mut writes = vec![0u32; out_len];
    let block_threads = kernel.launch.block as usize;
    // Blocks that never reach into each other's shared memory run one at a time, as
    // without clusters.
    let mut reaches = false;
    Stmt::walk(&kernel.body, &mut |s| {
        reaches |= matches!(
            s,
            Stmt::ClusterSync
                | Stmt::ClusterArrive { .. }
                | Stmt::TmaLoad {
                    multicast: Some(_),
                    ..
                }
        );
    });
    let cluster = if reaches {
        kernel.launch.cluster.count().max(1) as usize
    } else {
        1
    };
    let stride = if cluster > 1 {
        block_threads.div_ceil(WARPGROUP) * WARPGROUP
    } else {
        block_threads
    };
    let threads = stride * cluster;
    let blank = Cell {
        value: f32::NAN,
        written: None,
        read: None,
        pending: false,
        asynchronous: false,
        landed_in: None,
        wgmma_read: None,
    };
    let barriers = kernel.barriers() * cluster;
    let warpgroups = threads.div_ceil(WARPGROUP);
    let mut workspace = Workspace::new(kernel);
    for b in 0..kernel.launch.blocks() as usize / cluster {
        let mut block = Block {
            kernel,
            index: b,
            cluster,
            stride,
            threads,
            env: vec![vec![0; kernel.scope.vars.len()]; threads],
            acc: vec![vec![f32::NAN; kernel.accumulators as usize]; threads],
            tiles: [
                vec![blank; kernel.tile_elements[0] as usize * cluster],
                vec![blank; kernel.tile_elements[1] as usize * cluster],
            ],
            interval: 0,
            registers: Vec::new(),
            declared: Vec::new(),
            open_group: vec![Vec::new(); threads],
            groups: vec![Default::default(); threads],
            fragments: [vec![Vec::new(); threads], vec![Vec::new(); threads]],
            barriers: vec![Mbarrier::new(threads); barriers],
            published: vec![false; barriers],
            warpgroups: Warpgroups::new(warpgroups, threads, kernel.accumulators as usize),
            workspace: std::mem::take(&mut workspace),
            acquired: vec![None; threads],
            staging: Staging::new(
                kernel.staging.map_or(0, |s| s.elements as usize) * cluster,
                if kernel.staging.is_some() { threads } else { 0 },
            ),
        };
        let active: Vec<bool> = (0..threads).map(|t| t % stride < block_threads).collect();
        block.exec(&kernel.body, &active, inputs, &mut out, &mut writes)?;
        block.staging.unwaited().map_err(staging_error(b))?;
        workspace = block.workspace;
    }
    if let Some((semaphore, &value)) = workspace
        .semaphores
        .iter()
        .enumerate()
        .find(|(_, v)| **v != 0)
    {
        return Err(InterpError::SemaphoreLeft { semaphore, value });
    }
    if let Some(index) = workspace
        .partials
        .iter()
        .position(|p| p.is_some_and(|p| p.atomic))
    {
        return Err(InterpError::PartialLeft { index });
    }
    let expected = kernel.split_k.max(1);
    if let Some((index, &count)) = writes.iter().enumerate().find(|(_, c)| **c != expected) {
        return Err(InterpError::OutputWrites {
            index,
            count,
            expected,
        });
    }
    Ok(out)
}

impl Block<'_> {
    fn eval(&self, e: &Expr, t: usize) -> i64 {
        match e {
            Expr::Const(c) => *c,
            Expr::Var(v) => self.env[t][v.0],
            Expr::BlockIdx => (self.index * self.cluster + self.rank(t)) as i64,
            Expr::ThreadIdx => (t % self.stride) as i64,
            Expr::Add(a, b) => self.eval(a, t) + self.eval(b, t),
            Expr::Mul(a, c) => self.eval(a, t) * c,
            Expr::Div(a, c) => self.eval(a, t).div_euclid(*c),
            Expr::Rem(a, c) => self.eval(a, t).rem_euclid(*c),
            Expr::Xor(a, b) => self.eval(a, t) ^ self.eval(b, t),
            Expr::Min(a, b) => self.eval(a, t).min(self.eval(b, t)),
        }
    }

    fn holds(&self, conds: &[Cond], t: usize) -> bool {
        conds.iter().all(|c| {
            let v = self.eval(&c.expr, t);
            c.lo.is_none_or(|lo| v >= lo) && c.hi.is_none_or(|hi| v < hi)
        })
    }

    /// The rank in its cluster of the block that thread `t` belongs to.
    fn rank(&self, t: usize) -> usize {
        t / self.stride
    }

    /// Where element `index` of input `tile`'s shared tile of the cluster's block
    /// `rank` is kept, if the tile has it.
    fn cell_index(&self, tile: usize, rank: usize, index: i64) -> Option<usize> {
        let len = self.tiles[tile].len() / self.cluster;
        usize::try_from(index)
            .ok()
            .filter(|&i| i < len)
            .map(|i| rank * len + i)
    }

    fn read_shared(&mut self, tile: usize, index: i64, t: usize) -> Result<f32, InterpError> {
        let block = self.index;
        let interval = self.interval;
        let at = self.cell_index(tile, self.rank(t), index);
        let cell = at
            .and_then(|i| self.tiles[tile].get_mut(i))
            .ok_or(InterpError::Uninitialized { block, tile, index })?;
        if cell.pending {
            return Err(InterpError::AsyncPending { block, tile, index });
        }
        let ready = match (cell.landed_in, cell.written) {
            (Some((barrier, phase)), _) => {
                if !self.barriers[barrier].observed(t, phase) {
                    return Err(InterpError::TmaPending { block, tile, index });
                }
                true
            }
            (None, written) => match written {
                // A landed cp.async is seen by every thread after the next barrier.
                Some((w, _)) if cell.asynchronous => w < interval,
                // Fetched data must come from the barrier interval just before this one.
                Some((w, _)) => w + 1 == interval,
                None => false,
            },
        };
        if !ready {
            return Err(InterpError::Uninitialized { block, tile, index });
        }
        cell.read = match cell.read {
            Some((i, r)) if i == interval && r != t => Some((interval, usize::MAX)),
            _ => Some((interval, t)),
        };
        Ok(cell.value)
    }

    /// Thread `t`'s write of element `index` of input `tile`'s shared tile in the
    /// cluster's block `rank` (its own, or another's through a multicast copy); where
    /// it is kept.
    fn write_shared(
        &mut self,
        (tile, rank, index): (usize, usize, i64),
        t: usize,
        value: f32,
    ) -> Result<usize, InterpError> {
        let block = self.index;
        let interval = self.interval;
        let at = self.cell_index(tile, rank, index);
        let cell = at
            .and_then(|i| self.tiles[tile].get_mut(i))
            .ok_or(InterpError::Race { block, tile, index })?;
        if matches!(cell.read, Some((i, r)) if i == interval && r != t) {
            return Err(InterpError::Race { block, tile, index });
        }
        if let Some((warpgroup, group)) = cell.wgmma_read
            && self.warpgroups.knowledge(t)[warpgroup] <= group
        {
            return Err(InterpError::WgmmaRace {
                block,
                thread: t,
                tile,
                index,
                warpgroup,
            });
        }
        *cell = Cell {
            value,
            written: Some((interval, t)),
            read: cell.read,
            pending: false,
            asynchronous: false,
            landed_in: None,
            wgmma_read: None,
        };
        Ok(at.unwrap_or_default())
    }

    /// Every active thread's copy of `width` elements from global memory (zero where a
    /// condition fails) into shared memory, `step` elements apart there: a fetch's
    /// stores, or with `asynchronous` a `cp.async` that lands at a wait.
    fn copy(
        &mut self,
        (read, write): (&GlobalRead, &SharedWrite),
        active: &[bool],
        inputs: &Inputs,
        asynchronous: bool,
    ) -> Result<(), InterpError> {
        for t in (0..self.threads).filter(|&t| active[t]) {
            let (s, g) = (self.eval(&write.at, t), self.eval(&read.at, t));
            let ok = self.holds(&read.valid, t);
            for j in 0..i64::from(read.width) {
                let value = if ok {
                    self.read_global(inputs, read.input, g + j, t)?
                } else {
                    0.0
                };
                let at = s + j * write.step;
                if asynchronous {
                    self.write_async(write.input, at, t, value)?;
                } else {
                    self.write_shared((write.input, self.rank(t), at), t, value)?;
                }
            }
        }
        Ok(())
    }

    /// The fragment element (row, column) of thread `t`'s fragment `frag` of `input`.
    fn fragment(&self, input: usize, frag: usize, t: usize) -> Result<&Vec<f32>, InterpError> {
        self.fragments[input][t]
            .get(frag)
            .and_then(Option::as_ref)
            .ok_or(InterpError::UnsetFragment {
                block: self.index,
                thread: t,
                input,
                frag,
            })
    }

    /// Element `index` of input `input`, or the out-of-bounds error thread `t` hits.
    fn read_global(
        &self,
        inputs: &Inputs,
        input: usize,
        index: i64,
        t: usize,
    ) -> Result<f32, InterpError> {
        let data = inputs.inputs[input];
        usize::try_from(index)
            .ok()
            .and_then(|i| data.get(i))
            .copied()
            .ok_or(InterpError::OutOfBounds {
                block: self.index,
                thread: t,
                tensor: self.kernel.input(input),
                index,
                len: data.len(),
            })
    }

    /// Declares register array `array` (every slot unloaded), shadowing any array of
    /// that id until the enclosing block ends.
    fn declare(&mut self, array: usize, width: u32, len: i64) {
        let len = usize::try_from(len).unwrap_or(0);
        let fresh = RegisterArray {
            width,
            len,
            values: vec![None; self.threads * len * width as usize],
        };
        if self.registers.len() <= array {
            self.registers.resize(array + 1, None);
        }
        let shadowed = self.registers[array].replace(fresh);
        if let Some(frame) = self.declared.last_mut() {
            frame.push((array, shadowed));
        }
    }

    /// The position of component `j` of thread `t`'s slot `slot` in a declared array
    /// of width `width`.
    fn register_cell(
        &mut self,
        array: usize,
        slot: i64,
        width: u32,
        j: usize,
        t: usize,
    ) -> Result<&mut Option<f32>, InterpError> {
        let threads = self.threads;
        let missing = InterpError::RegisterSlot { array, slot, width };
        let Some(Some(regs)) = self.registers.get_mut(array) else {
            return Err(missing);
        };
        let slot_index = usize::try_from(slot)
            .ok()
            .filter(|&s| s < regs.len && regs.width == width && t < threads);
        let Some(s) = slot_index else {
            return Err(missing);
        };
        let w = regs.width as usize;
        Ok(&mut regs.values[(t * regs.len + s) * w + j])
    }

    fn exec(
        &mut self,
        stmts: &[Stmt],
        active: &[bool],
        inputs: &Inputs,
        out: &mut [f32],
        writes: &mut [u32],
    ) -> Result<(), InterpError> {
        let threads = 0..self.threads;
        for stmt in stmts {
            match stmt {
                Stmt::Let { var, value } => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        self.env[t][var.0] = self.eval(value, t);
                    }
                }
                Stmt::WarpUniform { var, value } => {
                    // Broadcast from lane 0 by the whole warp: every lane computes what
                    // lane 0 does, or the value was not warp-uniform.
                    let warps =
                        whole_groups(active, 32).map_err(|warp| InterpError::PartialWarp {
                            block: self.index,
                            warp,
                        })?;
                    for w in warps {
                        let lanes = w * 32..(w + 1) * 32;
                        let first = self.eval(value, w * 32);
                        if let Some(t) = lanes.clone().find(|&t| self.eval(value, t) != first) {
                            return Err(InterpError::NotWarpUniform {
                                block: self.index,
                                thread: t,
                            });
                        }
                        for t in lanes {
                            self.env[t][var.0] = first;
                        }
                    }
                }
                Stmt::Concurrent { parts } => {
                    self.concurrent(parts, active, inputs, out, writes)?;
                }
                Stmt::For {
                    var, extent, body, ..
                } => {
                    for i in 0..*extent {
                        for env in &mut self.env {
                            env[var.0] = i;
                        }
                        self.exec(body, active, inputs, out, writes)?;
                    }
                }
                Stmt::If { conds, body } => {
                    let inner: Vec<bool> = threads
                        .clone()
                        .map(|t| active[t] && self.holds(conds, t))
                        .collect();
                    if inner.contains(&true) {
                        self.exec(body, &inner, inputs, out, writes)?;
                    }
                }
                Stmt::Sync | Stmt::ClusterSync => {
                    // Every thread of the cluster, or of each block that reaches a
                    // block barrier (a branch may leave out whole blocks).
                    let cluster = matches!(stmt, Stmt::ClusterSync);
                    let block = self.kernel.launch.block as usize;
                    let mut reached = vec![false; self.cluster];
                    for (rank, reached) in reached.iter_mut().enumerate() {
                        let mut real = (rank * self.stride..).take(block);
                        *reached = real.clone().any(|t| active[t]);
                        if (cluster || *reached) && !real.all(|t| active[t]) {
                            return Err(InterpError::DivergentBarrier { block: self.index });
                        }
                    }
                    // (One interval for the cluster: only kernels that copy with TMA,
                    // which does not use intervals, run blocks together.)
                    self.interval += 1;
                    // A block barrier tells what its own warpgroups completed to the
                    // blocks that reached it; a cluster barrier what every one did, and
                    // publishes the barriers.
                    let stride = self.stride;
                    if self.kernel.staging.is_some() {
                        let members: Vec<usize> =
                            threads.clone().filter(|&t| reached[t / stride]).collect();
                        self.staging.barrier(&members);
                    }
                    for t in threads.clone().filter(|&t| reached[t / stride]) {
                        let mut retired = self.warpgroups.retired.clone();
                        if !cluster {
                            let own = self.own_warpgroups(t);
                            for (w, r) in retired.iter_mut().enumerate() {
                                if !own.contains(&w) {
                                    *r = 0;
                                }
                            }
                        }
                        self.warpgroups.learn(t, &retired);
                    }
                    if cluster {
                        for (b, published) in self.published.iter_mut().enumerate() {
                            *published |= self.barriers[b].initialized();
                        }
                    }
                }
                Stmt::FenceProxyAsync => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        self.staging.fence(t);
                    }
                }
                Stmt::NamedSync { id, threads: count } => {
                    // The active threads of each block naming each id meet; each
                    // barrier must have all of its threads.
                    let mut groups: std::collections::BTreeMap<(usize, i64), Vec<usize>> =
                        Default::default();
                    for t in threads.clone().filter(|&t| active[t]) {
                        groups
                            .entry((self.rank(t), self.eval(id, t)))
                            .or_default()
                            .push(t);
                    }
                    for members in groups.values() {
                        if members.len() != *count as usize {
                            return Err(InterpError::DivergentBarrier { block: self.index });
                        }
                        self.staging.barrier(members);
                    }
                }
                Stmt::TmaStore { map, coords, from } => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        self.tma_store(*map, coords, from, t, (out, writes))?;
                    }
                }
                Stmt::BulkWait { pending } => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        self.staging.wait(t, *pending);
                    }
                }
                Stmt::ZeroAcc => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        self.acc[t].fill(0.0);
                        self.warpgroups.unfenced[t] = true;
                    }
                }
                Stmt::Fetch { read, write } => {
                    self.copy((read, write), active, inputs, false)?;
                }
                Stmt::AsyncCopy { read, write } => {
                    self.copy((read, write), active, inputs, true)?;
                }
                Stmt::MbarrierInit { barrier, arrivals } => {
                    // One thread per barrier (one per block of a cluster).
                    let mut by_barrier = std::collections::BTreeMap::new();
                    for t in threads.clone().filter(|&t| active[t]) {
                        *by_barrier.entry(self.barrier(barrier, t)?).or_insert(0) += 1;
                    }
                    for (b, count) in by_barrier {
                        if count != 1 {
                            return Err(InterpError::MbarrierInit {
                                block: self.index,
                                barrier: b,
                                threads: count,
                            });
                        }
                        self.barriers[b].init(*arrivals);
                        self.published[b] = false;
                    }
                }
                Stmt::ArriveExpectTx { barrier, bytes } => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        let b = self.barrier(barrier, t)?;
                        self.initialized(b)?;
                        self.barriers[b].arrive(*bytes);
                    }
                }
                Stmt::MbarrierArrive { barrier } | Stmt::ClusterArrive { barrier, .. } => {
                    let ranks = match stmt {
                        Stmt::ClusterArrive { ranks, .. } => Some(ranks),
                        _ => None,
                    };
                    for t in threads.clone().filter(|&t| active[t]) {
                        for rank in self.destinations(t, ranks)? {
                            let b = self.barrier_of(barrier, t, rank)?;
                            self.initialized(b)?;
                            let knowledge = self.warpgroups.knowledge(t);
                            self.barriers[b].release(&knowledge);
                            self.barriers[b].arrive(0);
                        }
                    }
                }
                Stmt::TmaLoad {
                    map,
                    coords,
                    at,
                    barrier,
                    multicast,
                } => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        for rank in self.destinations(t, multicast.as_ref())? {
                            let b = self.barrier_of(barrier, t, rank)?;
                            self.initialized(b)?;
                            self.tma_load(*map, coords, (at, rank), b, t, inputs)?;
                        }
                    }
                }
                Stmt::MbarrierWait { barrier, parity } => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        let b = self.barrier(barrier, t)?;
                        let parity = self.eval(parity, t);
                        let phase = self.barriers[b].wait(t, parity).map_err(|e| {
                            InterpError::MbarrierWait {
                                block: self.index,
                                thread: t,
                                barrier: b,
                                problem: match e {
                                    WaitError::Uninitialized => "not initialized".to_string(),
                                    WaitError::Parity { expected, got } => format!(
                                        "waited with parity {got} for the phase of parity {expected}"
                                    ),
                                    WaitError::Deadlock {
                                        phase,
                                        arrived,
                                        arrivals,
                                        landed,
                                        expected,
                                    } => format!(
                                        "phase {phase} can never complete: {arrived} of {arrivals} arrivals, {landed} of {expected} bytes (a missing arrival or expect_tx, or a copy of other bytes)"
                                    ),
                                },
                            }
                        })?;
                        let carried = self.barriers[b].carried(phase).to_vec();
                        self.warpgroups.learn(t, &carried);
                    }
                }
                Stmt::WgmmaFence => {
                    for w in self.warpgroups_of(active)? {
                        for t in w * WARPGROUP..(w + 1) * WARPGROUP {
                            self.warpgroups.unfenced[t] = false;
                        }
                    }
                }
                Stmt::Wgmma { acc, n, a, b } => {
                    for w in self.warpgroups_of(active)? {
                        self.wgmma(w, (*acc, *n), [a, b])?;
                    }
                }
                Stmt::WgmmaCommit => {
                    for w in self.warpgroups_of(active)? {
                        self.warpgroups.committed[w] += 1;
                    }
                }
                Stmt::WgmmaWait { pending } => {
                    for w in self.warpgroups_of(active)? {
                        let done = self.warpgroups.committed[w].saturating_sub(u64::from(*pending));
                        let retired = &mut self.warpgroups.retired[w];
                        *retired = (*retired).max(done);
                    }
                }
                Stmt::CommitGroup => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        let group = std::mem::take(&mut self.open_group[t]);
                        self.groups[t].push_back(group);
                    }
                }
                Stmt::WaitGroup { pending } => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        while self.groups[t].len() > *pending as usize {
                            let group = self.groups[t].pop_front().unwrap_or_default();
                            for (tile, i) in group {
                                let cell = &mut self.tiles[tile][i];
                                // Landed now: readable after the next barrier.
                                if cell.pending {
                                    cell.pending = false;
                                    cell.written = Some((self.interval, t));
                                }
                            }
                        }
                    }
                }
                Stmt::LoadFragment {
                    input,
                    frag,
                    count,
                    base,
                    row,
                    k,
                    layout,
                    k_step,
                    k_major,
                } => {
                    // A is m × k, B is k × n; consecutive fragments are m or n apart.
                    let atom = MmaAtom::sizing(self.kernel.dtype);
                    let (rows, cols, stride) = if *input == 0 {
                        (atom.m, *k_step, atom.m)
                    } else {
                        (*k_step, atom.n, atom.n)
                    };
                    for t in threads.clone().filter(|&t| active[t]) {
                        let (b, k0) = (self.eval(base, t), self.eval(k, t));
                        for f in 0..*count {
                            let r0 = self.eval(row, t) + stride * f as i64;
                            let mut values = Vec::with_capacity((rows * cols) as usize);
                            for r in 0..rows {
                                for c in 0..cols {
                                    // (tile row, tile column) of operand element (r, c).
                                    let (tr, tc) = match (*input, *k_major) {
                                        (0, _) => (r0 + r, k0 + c),
                                        (_, true) => (r0 + c, k0 + r),
                                        (_, false) => (k0 + r, r0 + c),
                                    };
                                    let at = b + layout.offset(tr, tc);
                                    // A row-span register is one 32-bit load of a pair.
                                    let pair = matches!(layout, OperandLayout::Span(_));
                                    if pair && c % 2 == 0 && at % 2 != 0 {
                                        return Err(InterpError::MisalignedPair {
                                            block: self.index,
                                            thread: t,
                                            at,
                                        });
                                    }
                                    values.push(self.read_shared(*input, at, t)?);
                                }
                            }
                            let slots = &mut self.fragments[*input][t];
                            if slots.len() <= frag + f {
                                slots.resize(frag + f + 1, None);
                            }
                            slots[frag + f] = Some(values);
                        }
                    }
                }
                Stmt::Mma { acc, a, b } => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        let fa = self.fragment(0, *a, t)?.clone();
                        let fb = self.fragment(1, *b, t)?.clone();
                        let atom = MmaAtom::sizing(self.kernel.dtype);
                        let n = atom.n as usize;
                        let k = fb.len() / n;
                        let lane = (t % 32) as i64;
                        for e in 0..atom.c.values {
                            let (r, c) = atom.c.coord(lane, e);
                            let (r, c) = (r as usize, c as usize);
                            let i = self.acc_slot(&Expr::Const(acc + e), t)?;
                            let mut sum = self.acc[t][i];
                            for x in 0..k {
                                sum = fa[r * k + x].mul_add(fb[x * n + c], sum);
                            }
                            self.acc[t][i] = sum;
                        }
                    }
                }
                Stmt::Registers { array, width, len } => self.declare(*array, *width, *len),
                Stmt::RegisterLoad { array, slot, read } => {
                    let width = read.width;
                    for t in threads.clone().filter(|&t| active[t]) {
                        let (slot, g) = (self.eval(slot, t), self.eval(&read.at, t));
                        let ok = self.holds(&read.valid, t);
                        for j in 0..width as usize {
                            let value = if ok {
                                self.read_global(inputs, read.input, g + j as i64, t)?
                            } else {
                                0.0
                            };
                            *self.register_cell(*array, slot, width, j, t)? = Some(value);
                        }
                    }
                }
                Stmt::RegisterStore { array, slot, write } => {
                    let width = write.width;
                    for t in threads.clone().filter(|&t| active[t]) {
                        let (slot, s) = (self.eval(slot, t), self.eval(&write.at, t));
                        for j in 0..width as usize {
                            let value = self.register_cell(*array, slot, width, j, t)?.ok_or(
                                InterpError::UnsetRegister {
                                    block: self.index,
                                    thread: t,
                                    array: *array,
                                    slot,
                                },
                            )?;
                            self.write_shared(
                                (write.input, self.rank(t), s + j as i64 * write.step),
                                t,
                                value,
                            )?;
                        }
                    }
                }
                Stmt::Block { body } => {
                    // Bindings inside end with the block: restore what they shadowed.
                    let env = self.env.clone();
                    self.declared.push(Vec::new());
                    let result = self.exec(body, active, inputs, out, writes);
                    self.env = env;
                    for (array, shadowed) in self.declared.pop().into_iter().flatten().rev() {
                        self.registers[array] = shadowed;
                    }
                    result?;
                }
                Stmt::Fma { acc, a, b } => {
                    for t in threads.clone().filter(|&t| active[t]) {
                        let i = self.acc_slot(acc, t)?;
                        let (ia, ib) = (self.eval(a, t), self.eval(b, t));
                        let x = self.read_shared(0, ia, t)?;
                        let y = self.read_shared(1, ib, t)?;
                        // Rounded like the GPU's fused multiply-add.
                        self.acc[t][i] = x.mul_add(y, self.acc[t][i]);
                    }
                }
                Stmt::PartialStore {
                    acc,
                    at,
                    valid,
                    atomic,
                } => {
                    let storing: Vec<usize> = threads
                        .clone()
                        .filter(|&t| active[t] && self.holds(valid, t))
                        .collect();
                    for t in storing {
                        let i = self.settled(acc, t)?;
                        let p = self.partial_index(at, t)?;
                        let writer = (self.index, t / 32);
                        let fresh = Partial {
                            value: 0.0,
                            unpublished: 0,
                            published: None,
                            atomic: *atomic,
                        };
                        let slot = &mut self.workspace.partials[p];
                        // A plain store replaces the slot; an atomic adds onto it.
                        let slot = match slot {
                            Some(x) if *atomic => x,
                            _ => slot.insert(fresh),
                        };
                        slot.value += self.acc[t][i];
                        slot.atomic |= *atomic;
                        slot.unpublished += 1;
                        self.workspace
                            .unpublished
                            .entry(writer)
                            .or_default()
                            .push(p);
                    }
                }
                Stmt::PartialAdd {
                    acc,
                    at,
                    valid,
                    clear,
                } => {
                    let adding: Vec<usize> = threads
                        .clone()
                        .filter(|&t| active[t] && self.holds(valid, t))
                        .collect();
                    for t in adding {
                        let i = self.settled(acc, t)?;
                        let p = self.partial_index(at, t)?;
                        let slot = &mut self.workspace.partials[p];
                        let partial = if *clear { slot.take() } else { *slot };
                        let partial = partial
                            .filter(|x| {
                                x.unpublished == 0
                                    && x.published.is_some()
                                    && x.published == self.acquired[t]
                            })
                            .ok_or(InterpError::PartialUnpublished {
                                block: self.index,
                                thread: t,
                                index: p as i64,
                            })?;
                        self.acc[t][i] += partial.value;
                        self.warpgroups.unfenced[t] = true;
                    }
                }
                Stmt::LastArrival {
                    counter,
                    arrivals,
                    weight,
                    body,
                } => {
                    let arrival = (counter, *arrivals, weight);
                    self.last_arrival(arrival, active, body, (inputs, out, writes))?;
                }
                Stmt::Store {
                    acc,
                    out: index,
                    bias,
                    bias_when,
                    valid,
                    atomic,
                    width,
                    staged,
                } => {
                    let storing: Vec<usize> = threads
                        .clone()
                        .filter(|&t| active[t] && self.holds(valid, t))
                        .collect();
                    for t in storing {
                        for j in 0..i64::from(*width) {
                            let slot = self.scope_add(acc, j);
                            let i = self.settled(&slot, t)?;
                            let mut v = self.acc[t][i];
                            if let (Some(b), Some(data)) = (bias, inputs.bias)
                                && self.holds(bias_when, t)
                            {
                                let bi = self.eval(b, t) + j;
                                v += *usize::try_from(bi).ok().and_then(|i| data.get(i)).ok_or(
                                    InterpError::OutOfBounds {
                                        block: self.index,
                                        thread: t,
                                        tensor: "bias",
                                        index: bi,
                                        len: data.len(),
                                    },
                                )?;
                            }
                            if self.kernel.relu {
                                v = v.max(0.0);
                            }
                            let o = self.eval(index, t) + j;
                            if *staged {
                                let len = self.kernel.staging.map_or(0, |s| s.elements);
                                let at = self.rank(t) as i64 * len + o;
                                let o = if (0..len).contains(&o) { at } else { -1 };
                                self.staging
                                    .write(t, o, v)
                                    .map_err(staging_error(self.index))?;
                                continue;
                            }
                            let o = usize::try_from(o).ok().filter(|&o| o < out.len()).ok_or(
                                InterpError::OutOfBounds {
                                    block: self.index,
                                    thread: t,
                                    tensor: "out",
                                    index: o,
                                    len: out.len(),
                                },
                            )?;
                            if *atomic {
                                out[o] += v;
                            } else {
                                out[o] = v;
                            }
                            writes[o] += 1;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `e + j` as an expression.
    fn scope_add(&self, e: &Expr, j: i64) -> Expr {
        self.kernel.scope.add(e.clone(), Expr::Const(j))
    }
}

/// The groups of `size` consecutive threads (warps, warpgroups) with an active thread,
/// or the first that is active only in part.
fn whole_groups(active: &[bool], size: usize) -> Result<Vec<usize>, usize> {
    let mut out = Vec::new();
    for (g, threads) in active.chunks(size).enumerate() {
        match (threads.iter().any(|&a| a), threads.iter().all(|&a| a)) {
            (false, _) => {}
            (true, true) if threads.len() == size => out.push(g),
            _ => return Err(g),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Param, Role, Scope, SharedPool};
    use crate::launch::LaunchConfig;

    /// One block of two threads, two accumulators each, tiles of 4 floats, running
    /// `body` over inputs and an output of 4 floats.
    fn run_body(scope: Scope, body: Vec<Stmt>) -> Result<Vec<f32>, InterpError> {
        run_with(scope, body, Vec::new())
    }

    /// `run_body` with `maps` as parameters after the inputs' buffers.
    /// A float32 kernel of `body` with two accumulators and two 4-float tiles.
    fn test_kernel(
        scope: Scope,
        body: Vec<Stmt>,
        params: Vec<Param>,
        launch: LaunchConfig,
    ) -> Kernel {
        Kernel {
            name: "k".to_string(),
            scope,
            shared: SharedPool::FloatTiles,
            staging: None,
            params,
            relu: false,
            dtype: crate::task::DType::F32,
            out_dtype: crate::task::DType::F32,
            tile_offsets: [0, 4],
            tile_elements: [4, 4],
            accumulators: 2,
            split_k: 1,
            semaphores: 0,
            body,
            launch,
        }
    }

    fn run_with(scope: Scope, body: Vec<Stmt>, maps: Vec<Param>) -> Result<Vec<f32>, InterpError> {
        let mut params: Vec<Param> = ["a", "b"]
            .into_iter()
            .enumerate()
            .map(|(i, name)| Param::Buffer {
                name,
                role: Role::Input(i),
                dtype: crate::task::DType::F32,
            })
            .collect();
        params.extend(maps);
        let kernel = test_kernel(scope, body, params, LaunchConfig::linear(1, 2, 32));
        let (a, b) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
        let inputs = Inputs {
            inputs: [&a, &b],
            bias: None,
        };
        run(&kernel, &inputs, 4)
    }

    /// A value broadcast from lane 0 must be the same on every lane of its warp:
    /// `threadIdx / 32` is, `threadIdx / 16` is not.
    #[test]
    fn warp_uniform_values_are_checked_lane_by_lane() {
        let run_divided = |divisor: i64| {
            let mut scope = Scope::new(1, 64);
            let value = scope.div(Expr::ThreadIdx, divisor);
            let (lo, hi) = scope.range(&value);
            let var = scope.var("warp", lo, hi);
            // Threads 0..4 store (the warp index times zero) into the output.
            let store = Stmt::Store {
                acc: Expr::Const(0),
                out: scope.add(Expr::ThreadIdx, scope.mul(Expr::Var(var), 0)),
                bias: None,
                bias_when: Vec::new(),
                valid: vec![Cond {
                    expr: Expr::ThreadIdx,
                    lo: None,
                    hi: Some(4),
                }],
                atomic: false,
                staged: false,
                width: 1,
            };
            let params = ["a", "b", "out"]
                .into_iter()
                .enumerate()
                .map(|(i, name)| Param::Buffer {
                    name,
                    role: if i < 2 { Role::Input(i) } else { Role::Output },
                    dtype: crate::task::DType::F32,
                })
                .collect();
            let body = vec![Stmt::ZeroAcc, Stmt::WarpUniform { var, value }, store];
            let kernel = test_kernel(scope, body, params, LaunchConfig::linear(1, 64, 32));
            let (a, b) = ([0.0; 4], [0.0; 4]);
            let inputs = Inputs {
                inputs: [&a, &b],
                bias: None,
            };
            run(&kernel, &inputs, 4)
        };
        assert_eq!(run_divided(32), Ok(vec![0.0; 4]));
        assert!(matches!(
            run_divided(16),
            Err(InterpError::NotWarpUniform { thread: 16, .. })
        ));
    }

    /// Both inputs (4 floats each) copied by TMA, with the map of `a` over `a_extent`
    /// elements, then `out[2t + i] = a_sh[2t + i] * b_sh[2t + i]` on two threads. Thread
    /// 0 initializes the mbarrier (or every thread, with `init_all`), arrives expecting
    /// `expect` bytes, and issues both copies; the block waits with `parity` (no wait
    /// without one).
    fn run_tma(
        a_extent: u64,
        init_all: bool,
        expect: Option<i64>,
        parity: Option<i64>,
    ) -> Result<Vec<f32>, InterpError> {
        use crate::atom::tma::TensorBox;
        use crate::atom::wgmma::Swizzle;
        let mut scope = Scope::new(1, 2);
        let map = |extent| {
            TensorBox::matrix(
                crate::task::DType::F32,
                1,
                extent,
                4,
                1,
                0,
                1,
                4,
                Swizzle::None,
            )
            .unwrap()
        };
        let thread0 = vec![Cond {
            expr: Expr::ThreadIdx,
            lo: None,
            hi: Some(1),
        }];
        let load = |map: usize| Stmt::TmaLoad {
            map,
            coords: vec![Expr::Const(0), Expr::Const(0)],
            at: Expr::Const(0),
            barrier: Expr::Const(0),
            multicast: None,
        };
        let init = Stmt::MbarrierInit {
            barrier: Expr::Const(0),
            arrivals: 1,
        };
        let mut issue: Vec<Stmt> = expect
            .map(|bytes| Stmt::ArriveExpectTx {
                barrier: Expr::Const(0),
                bytes,
            })
            .into_iter()
            .collect();
        issue.extend([load(2), load(3)]);
        let mut body = vec![
            if init_all {
                init
            } else {
                Stmt::If {
                    conds: thread0.clone(),
                    body: vec![init],
                }
            },
            Stmt::Sync,
            Stmt::If {
                conds: thread0,
                body: issue,
            },
        ];
        body.extend(parity.map(|p| Stmt::MbarrierWait {
            barrier: Expr::Const(0),
            parity: Expr::Const(p),
        }));
        let i = scope.var("i", 0, 1);
        let at = scope.add(scope.mul(Expr::ThreadIdx, 2), Expr::Var(i));
        body.push(Stmt::ZeroAcc);
        body.push(Stmt::For {
            var: i,
            extent: 2,
            unroll: true,
            body: vec![Stmt::Fma {
                acc: Expr::Var(i),
                a: at.clone(),
                b: at,
            }],
        });
        body.push(store_both(&mut scope));
        let maps = vec![
            Param::TensorMap {
                name: "a_map",
                input: 0,
                tensor: map(a_extent),
            },
            Param::TensorMap {
                name: "b_map",
                input: 1,
                tensor: map(4),
            },
        ];
        run_with(scope, body, maps)
    }

    #[test]
    fn tma_copies_land_at_the_mbarrier_phase_and_pad_with_zeros() {
        assert_eq!(
            run_tma(4, false, Some(32), Some(0)),
            Ok(vec![5.0, 12.0, 21.0, 32.0])
        );
        // A tensor of 3 elements: the box's fourth is zero.
        assert_eq!(
            run_tma(3, false, Some(32), Some(0)),
            Ok(vec![5.0, 12.0, 21.0, 0.0])
        );
    }

    #[test]
    fn broken_mbarrier_protocols_are_caught() {
        let problem = |r: Result<Vec<f32>, InterpError>| match r {
            Err(InterpError::MbarrierWait { problem, .. }) => problem,
            other => panic!("{other:?}"),
        };
        // No expect_tx: the phase never completes.
        assert!(problem(run_tma(4, false, None, Some(0))).contains("can never complete"));
        // Expecting fewer bytes than the copies bring: the phase completes with the first
        // copy, and the second one's data belongs to a phase nobody waited for.
        assert!(matches!(
            run_tma(4, false, Some(16), Some(0)),
            Err(InterpError::TmaPending { tile: 1, .. })
        ));
        // Expecting more: the phase never completes.
        assert!(problem(run_tma(4, false, Some(48), Some(0))).contains("32 of 48 bytes"));
        // The wrong parity.
        assert!(problem(run_tma(4, false, Some(32), Some(1))).contains("parity 1"));
        // No wait: the copies are read before their phase was waited for.
        assert!(matches!(
            run_tma(4, false, Some(32), None),
            Err(InterpError::TmaPending { .. })
        ));
        // Every thread initializing the barrier.
        assert!(matches!(
            run_tma(4, true, Some(32), Some(0)),
            Err(InterpError::MbarrierInit { threads: 2, .. })
        ));
    }

    /// `out[2 * t + i] = acc[i]` for both accumulators of thread `t`.
    fn store_both(scope: &mut Scope) -> Stmt {
        let i = scope.var("i", 0, 1);
        let out = scope.add(scope.mul(Expr::ThreadIdx, 2), Expr::Var(i));
        Stmt::For {
            var: i,
            extent: 2,
            unroll: true,
            body: vec![Stmt::Store {
                width: 1,
                acc: Expr::Var(i),
                out,
                bias: None,
                bias_when: Vec::new(),
                valid: Vec::new(),
                atomic: false,
                staged: false,
            }],
        }
    }

    /// Two blocks of two threads in a cluster of two (run together, as a kernel that
    /// synchronizes its cluster is): a block barrier that only one block reaches is
    /// legal, one that part of each block reaches is not.
    #[test]
    fn a_block_barrier_in_a_cluster_is_each_blocks_own() {
        let run_cluster = |branch: Cond| {
            let scope = Scope::new(2, 2);
            let out = scope.add(scope.mul(Expr::BlockIdx, 2), Expr::ThreadIdx);
            let store = Stmt::Store {
                width: 1,
                acc: Expr::Const(0),
                out,
                bias: None,
                bias_when: Vec::new(),
                valid: Vec::new(),
                atomic: false,
                staged: false,
            };
            let body = vec![
                Stmt::ClusterSync,
                Stmt::ZeroAcc,
                Stmt::If {
                    conds: vec![branch],
                    body: vec![Stmt::Sync],
                },
                store,
                Stmt::ClusterSync,
            ];
            let mut launch = LaunchConfig::linear(2, 2, 0);
            launch.cluster = crate::launch::Dim3::linear(2);
            let kernel = test_kernel(scope, body, Vec::new(), launch);
            let inputs = Inputs {
                inputs: [&[], &[]],
                bias: None,
            };
            run(&kernel, &inputs, 4)
        };
        let first_block = Cond {
            expr: Expr::BlockIdx,
            lo: None,
            hi: Some(1),
        };
        assert_eq!(run_cluster(first_block), Ok(vec![0.0; 4]));
        let first_threads = Cond {
            expr: Expr::ThreadIdx,
            lo: None,
            hi: Some(1),
        };
        assert!(matches!(
            run_cluster(first_threads),
            Err(InterpError::DivergentBarrier { .. })
        ));
    }

    #[test]
    fn a_block_restores_the_variables_it_shadows() {
        let mut scope = Scope::new(1, 2);
        let ro = scope.var("ro", 0, 1);
        let next = scope.var("ro_next", 1, 1);
        // for (ro < 2) { { const int ro = 7; } acc[ro] += a_sh[2t + ro] * b_sh[...]; }:
        // inside the block `ro` is 7 (an accumulator out of range if it leaked).
        let shared = scope.add(scope.mul(Expr::ThreadIdx, 2), Expr::Var(ro));
        let fetch = |input| Stmt::Fetch {
            read: GlobalRead {
                input,
                at: shared.clone(),
                valid: Vec::new(),
                width: 1,
            },
            write: SharedWrite {
                input,
                at: shared.clone(),
                width: 1,
                step: 1,
                vector: false,
            },
        };
        let body = vec![
            Stmt::ZeroAcc,
            Stmt::For {
                var: ro,
                extent: 2,
                unroll: false,
                body: vec![
                    Stmt::Block {
                        body: vec![
                            Stmt::Let {
                                var: next,
                                value: Expr::Const(7),
                            },
                            Stmt::Let {
                                var: ro,
                                value: Expr::Var(next),
                            },
                        ],
                    },
                    fetch(0),
                    fetch(1),
                    Stmt::Sync,
                    Stmt::Fma {
                        acc: Expr::Var(ro),
                        a: shared.clone(),
                        b: shared.clone(),
                    },
                ],
            },
            store_both(&mut scope),
        ];
        assert_eq!(run_body(scope, body), Ok(vec![5.0, 12.0, 21.0, 32.0]));
    }

    /// Both inputs through registers: thread `t` loads its two floats of each as one
    /// vector, stores them to the tiles, and multiplies them.
    fn through_registers(scope: &mut Scope, load: bool, scoped: bool) -> Vec<Stmt> {
        let base = scope.mul(Expr::ThreadIdx, 2);
        let mut declare_and_load = Vec::new();
        for input in 0..2 {
            declare_and_load.push(Stmt::Registers {
                array: input,
                width: 2,
                len: 1,
            });
            if load {
                declare_and_load.push(Stmt::RegisterLoad {
                    array: input,
                    slot: Expr::Const(0),
                    read: GlobalRead {
                        input,
                        at: base.clone(),
                        valid: Vec::new(),
                        width: 2,
                    },
                });
            }
        }
        let mut body = if scoped {
            vec![Stmt::Block {
                body: declare_and_load,
            }]
        } else {
            declare_and_load
        };
        for input in 0..2 {
            body.push(Stmt::RegisterStore {
                array: input,
                slot: Expr::Const(0),
                write: SharedWrite {
                    input,
                    at: base.clone(),
                    width: 2,
                    step: 1,
                    vector: true,
                },
            });
        }
        body.push(Stmt::Sync);
        body.push(Stmt::ZeroAcc);
        for j in 0..2 {
            let at = scope.add(base.clone(), Expr::Const(j));
            body.push(Stmt::Fma {
                acc: Expr::Const(j),
                a: at.clone(),
                b: at,
            });
        }
        body.push(store_both(scope));
        body
    }

    #[test]
    fn registers_carry_loads_to_stores() {
        let mut scope = Scope::new(1, 2);
        let body = through_registers(&mut scope, true, false);
        assert_eq!(run_body(scope, body), Ok(vec![5.0, 12.0, 21.0, 32.0]));
    }

    #[test]
    fn reading_an_unloaded_register_is_an_error() {
        let mut scope = Scope::new(1, 2);
        let body = through_registers(&mut scope, false, false);
        assert_eq!(
            run_body(scope, body),
            Err(InterpError::UnsetRegister {
                block: 0,
                thread: 0,
                array: 0,
                slot: 0
            })
        );
    }

    #[test]
    fn registers_declared_in_a_block_end_with_it() {
        let mut scope = Scope::new(1, 2);
        let body = through_registers(&mut scope, true, true);
        assert_eq!(
            run_body(scope, body),
            Err(InterpError::RegisterSlot {
                array: 0,
                slot: 0,
                width: 2
            })
        );
    }

    #[test]
    fn a_slot_outside_its_array_is_an_error() {
        let mut scope = Scope::new(1, 2);
        let mut body = through_registers(&mut scope, true, false);
        if let Stmt::RegisterLoad { slot, .. } = &mut body[1] {
            *slot = Expr::Const(1);
        }
        assert_eq!(
            run_body(scope, body),
            Err(InterpError::RegisterSlot {
                array: 0,
                slot: 1,
                width: 2
            })
        );
    }
}
