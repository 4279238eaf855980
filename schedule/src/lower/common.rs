//! What the sketches' lowerings build their nests with: named bindings, index
//! decomposition, affine index terms, the bias offset, loop wrapping, and the
//! tensor-core sketches' split-K fixup and stream-K runs.

use crate::gemm::GemmView;
use crate::ir::{Cond, Expr, Param, Role, Scope, Stmt, Var};
use crate::stream_k::StreamK;
use crate::task::{Access, AffineIndex, AxisRef, Contraction};

/// Binds `value` to a named `const int` unless it is already trivial.
pub(crate) fn bind(scope: &mut Scope, out: &mut Vec<Stmt>, name: &str, value: Expr) -> Expr {
    if matches!(value, Expr::Const(_) | Expr::Var(_)) {
        return value;
    }
    let (lo, hi) = scope.range(&value);
    let var = scope.var(name, lo, hi);
    out.push(Stmt::Let { var, value });
    Expr::Var(var)
}

/// Decomposes `index` (row-major over `extents`, last fastest) into bound coordinates.
pub(crate) fn decompose(
    scope: &mut Scope,
    out: &mut Vec<Stmt>,
    index: Expr,
    extents: &[i64],
    names: &[String],
) -> Vec<Expr> {
    let mut coords = vec![Expr::Const(0); extents.len()];
    let mut inner = 1;
    for d in (0..extents.len()).rev() {
        let q = scope.div(index.clone(), inner);
        coords[d] = scope.rem(q, extents[d]);
        inner *= extents[d];
    }
    coords
        .into_iter()
        .zip(names)
        .map(|(v, name)| bind(scope, out, name, v))
        .collect()
}

/// `sum(coeff * value)` over an affine index's terms (its offset excluded), with the
/// value of each spatial and reduction axis given.
pub(crate) fn affine_terms(
    scope: &Scope,
    index: &AffineIndex,
    spatial: &[Expr],
    reduction: &[Expr],
) -> Expr {
    scope.sum(index.terms.iter().map(|&(axis, coeff)| {
        let value = match axis {
            AxisRef::Spatial(a) => spatial[a].clone(),
            AxisRef::Reduction(r) => reduction[r].clone(),
        };
        scope.mul(value, coeff)
    }))
}

/// The bias element of the output element at `coords` (a bias is indexed by output
/// axes only).
pub(crate) fn bias_offset(scope: &Scope, access: &Access, coords: &[Expr]) -> Expr {
    scope.sum(
        access
            .index
            .iter()
            .zip(access.strides())
            .map(|(index, stride)| {
                let i = affine_terms(scope, index, coords, &[]);
                scope.mul(scope.add(i, Expr::Const(index.offset)), stride)
            }),
    )
}

pub(crate) fn var_or_zero(v: Option<Var>) -> Expr {
    v.map_or(Expr::Const(0), Expr::Var)
}

/// Nests `body` in loops over `vars` (first outermost); absent variables add no loop.
pub(crate) fn wrap_loops(
    vars: &[Option<Var>],
    extents: &[i64],
    unroll: impl Fn(usize) -> bool,
    body: Vec<Stmt>,
) -> Vec<Stmt> {
    let mut body = body;
    for (i, (var, &extent)) in vars.iter().zip(extents).enumerate().rev() {
        if let Some(var) = var {
            body = vec![Stmt::For {
                var: *var,
                extent,
                unroll: unroll(i),
                body,
            }];
        }
    }
    body
}

/// A contraction's kernel parameters: both inputs, the bias if any, the output.
pub(crate) fn tensor_params(c: &Contraction) -> Vec<Param> {
    let buffer = |name, role, dtype| Param::Buffer { name, role, dtype };
    let mut params = vec![
        buffer(c.inputs[0].tensor, Role::Input(0), c.dtype),
        buffer(c.inputs[1].tensor, Role::Input(1), c.dtype),
    ];
    if c.bias.is_some() {
        params.push(buffer("bias", Role::Bias, c.dtype));
    }
    params.push(buffer("out", Role::Output, c.out_dtype));
    params
}

/// `body` under `cond` (an `If`), or, without one, inlined into `out`, or in a C block of
/// its own when `scoped` (its bindings then end with it).
pub(crate) fn guarded(out: &mut Vec<Stmt>, cond: Option<Cond>, body: Vec<Stmt>, scoped: bool) {
    match cond {
        Some(cond) => out.push(Stmt::If {
            conds: vec![cond],
            body,
        }),
        None if scoped => out.push(Stmt::Block { body }),
        None => out.extend(body),
    }
}

/// The epilogue's store of accumulator `acc` to output element `out` (at output
/// coordinates `coords`, written where `valid` holds), with the contraction's bias; under
/// split-K (`split`: the block's split coordinate) an atomic add, the bias from chunk 0
/// only; with `staged`, `out` is an element of the staging buffers.
pub(crate) fn epilogue_store(
    scope: &Scope,
    c: &Contraction,
    coords: &[Expr],
    split: Option<&Expr>,
    (acc, out, valid, width): (Expr, Expr, Vec<Cond>, u32),
    staged: bool,
) -> Stmt {
    let bias = c
        .bias
        .as_ref()
        .map(|access| bias_offset(scope, access, coords));
    let bias_when = match (split, &bias) {
        (Some(z), Some(_)) => scope.bound(z, 0, 1).into_iter().collect(),
        _ => Vec::new(),
    };
    Stmt::Store {
        acc,
        out,
        bias,
        bias_when,
        valid,
        atomic: split.is_some(),
        width,
        staged,
    }
}

/// The extents and names of spatial axes `axes`.
pub(crate) fn axis_extents(c: &Contraction, axes: &[usize]) -> (Vec<i64>, Vec<String>) {
    (
        axes.iter()
            .map(|&a| i64::from(c.spatial[a].extent))
            .collect(),
        axes.iter()
            .map(|&a| c.spatial[a].name.to_string())
            .collect(),
    )
}

/// The tensor-core sketches' store of accumulator `acc` (and the next `width - 1`) to
/// element (`row`, `col`) (and the next columns) of the GEMM view's output in batch
/// `batch` (the view's batch coordinates): bounded by M and N, decomposed into the
/// output's axes, through the fused epilogue. With `staged`, to element `staged` of the
/// staging buffers instead (the bias still the element's).
pub(crate) fn gemm_store(
    scope: &mut Scope,
    c: &Contraction,
    view: &GemmView,
    batch: &[Expr],
    (row, col, acc, width): (Expr, Expr, Expr, u32),
    (split, staged): (Option<&Expr>, Option<Expr>),
) -> Vec<Stmt> {
    let mut body = Vec::new();
    let row = bind(scope, &mut body, "out_m", row);
    let col = bind(scope, &mut body, "out_n", col);
    let valid = gemm_valid(scope, view, &row, &col);
    let (m_ext, m_names) = axis_extents(c, &view.m_axes);
    let (n_ext, n_names) = axis_extents(c, &view.n_axes);
    let m_names: Vec<String> = m_names.iter().map(|n| format!("out_{n}")).collect();
    let n_names: Vec<String> = n_names.iter().map(|n| format!("out_{n}")).collect();
    let mc = decompose(scope, &mut body, row, &m_ext, &m_names);
    let nc = decompose(scope, &mut body, col, &n_ext, &n_names);
    let mut coords = vec![Expr::Const(0); c.spatial.len()];
    for (axes, values) in [
        (&view.batch_axes, batch),
        (&view.m_axes, &mc[..]),
        (&view.n_axes, &nc[..]),
    ] {
        for (&a, x) in axes.iter().zip(values) {
            coords[a] = x.clone();
        }
    }
    let out = scope.sum(
        coords
            .iter()
            .zip(c.output_strides())
            .map(|(x, st)| scope.mul(x.clone(), st)),
    );
    let to_staging = staged.is_some();
    body.push(epilogue_store(
        scope,
        c,
        &coords,
        split,
        (acc, staged.unwrap_or(out), valid, width),
        to_staging,
    ));
    body
}

/// Element (`row`, `col`) of the GEMM view's output exists.
pub(crate) fn gemm_valid(scope: &Scope, view: &GemmView, row: &Expr, col: &Expr) -> Vec<Cond> {
    let mut valid: Vec<Cond> = scope.bound(row, 0, view.m as i64).into_iter().collect();
    valid.extend(scope.bound(col, 0, view.n as i64));
    valid
}

/// Most partial sums a thread's ordered fixup adds in one unrolled loop.
const MAX_UNROLLED_ADDS: i64 = 512;

/// Split-K through the workspace, as the tensor-core sketches run it: the slot of
/// accumulator `acc` of each of a block's `threads` threads in the partial sums of
/// `unit` (a chunk's own, or with atomic sums its tile's), so that a warp's stores
/// and loads are coalesced.
pub(crate) fn partial_index(
    scope: &Scope,
    unit: Expr,
    acc: Expr,
    (accumulators, threads): (i64, i64),
) -> Expr {
    let slot = scope.add(scope.mul(unit, accumulators), acc);
    scope.add(scope.mul(slot, threads), Expr::ThreadIdx)
}

/// One accumulator's partial-sum statement at workspace slot `at`: the unit's store
/// (an atomic addition with atomic sums), or with `read` the fixup's read (clearing
/// atomic sums for the next launch).
pub(crate) fn partial_sum(
    read: bool,
    atomic: bool,
    (acc, at, valid): (Expr, Expr, Vec<Cond>),
) -> Stmt {
    if read {
        Stmt::PartialAdd {
            acc,
            at,
            valid,
            clear: atomic,
        }
    } else {
        Stmt::PartialStore {
            acc,
            at,
            valid,
            atomic,
        }
    }
}

/// How a split tile's last arrival reads its partial sums.
pub(crate) enum FixupReads {
    /// Atomic sums: the tile's one slot per accumulator, read and cleared.
    Take(Vec<Stmt>),
    /// Ordered sums: every chunk's slots (`adds`, over chunk `chunk`) in chunk order,
    /// so that the sum does not depend on which block came last.
    Chunks { chunk: Var, adds: Vec<Stmt> },
}

/// The end of a split unit of output tile `tile`, after its partial sums were stored
/// or added: each warp arrives on its semaphore of the tile (one per tile and each of
/// the block's `warps`, as a warp's lanes read back only their own slots), adding
/// `weight`; the warp whose arrival brings it to
/// `split` reads the tile's sums (`reads`) and runs `epilogue`. Its arrival resets the
/// semaphore (and a take clears the atomic sums), so the workspace is zeroed once, not
/// per launch. (A split's units arrive with weight 1; stream-K's segments with their K
/// tiles, `split` being the tile's.)
pub(crate) fn split_fixup(
    scope: &Scope,
    (split, accumulators): (i64, i64),
    (tile, warps, weight): (Expr, i64, Expr),
    reads: FixupReads,
    epilogue: Vec<Stmt>,
) -> Stmt {
    let warp = scope.div(Expr::ThreadIdx, 32);
    let counter = scope.add(scope.mul(tile, warps), warp);
    let mut fixup = vec![Stmt::ZeroAcc];
    match reads {
        FixupReads::Take(take) => fixup.extend(take),
        FixupReads::Chunks { chunk, adds } => fixup.push(Stmt::For {
            var: chunk,
            extent: split,
            // Unrolled, every chunk's loads are in flight at once (the fixup is
            // otherwise a chain of L2 round trips), up to a bound on code size.
            unroll: split * accumulators <= MAX_UNROLLED_ADDS,
            body: adds,
        }),
    }
    fixup.extend(epilogue);
    Stmt::LastArrival {
        counter,
        arrivals: split as u32,
        weight,
        body: fixup,
    }
}

/// A stream-K block's run of the tile-major iterations (every tile's K tiles,
/// `crate::stream_k`): block `b` of `B` takes `[b·I/B, (b+1)·I/B)` of the `I`, so runs
/// differ by one at most. Its first iteration, the one past its last, their count, and
/// the longest run's (a loop's trip count).
pub(crate) struct StreamRun {
    pub start: Expr,
    pub end: Expr,
    pub len: Expr,
    pub longest: i64,
    /// K tiles per output tile.
    ktiles: i64,
}

impl StreamRun {
    /// This block's run of `stream`, bound in `out`.
    pub fn bind(scope: &mut Scope, out: &mut Vec<Stmt>, stream: &StreamK) -> StreamRun {
        let (total, blocks) = (stream.iterations() as i64, stream.blocks as i64);
        let start = scope.div(scope.mul(Expr::BlockIdx, total), blocks);
        let end = scope.div(
            scope.mul(scope.add(Expr::BlockIdx, Expr::Const(1)), total),
            blocks,
        );
        let start = bind(scope, out, "run_start", start);
        let end = bind(scope, out, "run_end", end);
        let longest = stream.longest() as i64;
        let len = scope.var("run_len", total / blocks, longest);
        let value = scope.add(end.clone(), scope.mul(start.clone(), -1));
        out.push(Stmt::Let { var: len, value });
        StreamRun {
            start,
            end,
            len: Expr::Var(len),
            longest,
            ktiles: stream.ktiles as i64,
        }
    }

    /// Iteration `g` is in the run.
    pub fn has(&self, scope: &Scope, g: &Expr) -> Option<Cond> {
        let left = scope.add(self.len.clone(), scope.mul(g.clone(), -1));
        scope.bound(&left, 1, i64::MAX)
    }

    /// The output tile and the K tile (of the tile's reduction) of iteration `g`.
    pub fn work(&self, scope: &Scope, g: &Expr) -> (Expr, Expr) {
        let at = scope.add(self.start.clone(), g.clone());
        (
            scope.div(at.clone(), self.ktiles),
            scope.rem(at, self.ktiles),
        )
    }

    /// Where iteration `g` ends the block's segment of its tile before the run's end
    /// (the tile's last K tile, with more of the run after it), and the segment's K
    /// tiles: it began at the run's start or at the tile's first K tile.
    pub fn segment_end(&self, scope: &Scope, g: &Expr) -> (Vec<Cond>, Expr) {
        let (_, kt) = self.work(scope, g);
        let later = scope.add(self.len.clone(), scope.mul(g.clone(), -1));
        let ends = [
            scope.bound(&kt, self.ktiles - 1, i64::MAX),
            scope.bound(&later, 2, i64::MAX),
        ]
        .into_iter()
        .flatten()
        .collect();
        let weight = scope.min(
            scope.add(g.clone(), Expr::Const(1)),
            Expr::Const(self.ktiles),
        );
        (ends, weight)
    }

    /// The run's last segment: its output tile and K tiles.
    pub fn last_segment(&self, scope: &Scope) -> (Expr, Expr) {
        let last = scope.add(self.end.clone(), Expr::Const(-1));
        let (tile, kt) = (
            scope.div(last.clone(), self.ktiles),
            scope.rem(last, self.ktiles),
        );
        (
            tile,
            scope.min(self.len.clone(), scope.add(kt, Expr::Const(1))),
        )
    }
}
