//! Register prefetch (`State::prefetch`) as a transform of the loop nest.
//!
//! Lowering builds a prefetching state's reduction as one flattened stage loop (see
//! `lower`), each iteration `[if (tail) {] lets; fetches; barrier; inner product;
//! barrier [}]`. This pass splits every `Fetch` of that loop into its global half (a
//! `RegisterLoad` into a per-thread register array) and its shared half (a
//! `RegisterStore` from it), and moves the global half one stage ahead:
//!
//! ```text
//! float4 pf0[n0]; ...                       one array per fetch, a slot per fetch-loop step
//! { const int ro = 0; <stage 0's loads> }
//! for (ro) {
//!   <stores from the registers>             (with the stage's own lets, tail guard kept)
//!   __syncthreads();
//!   if (ro + 1 < extent) {
//!     const int ro_next = ro + 1;
//!     { const int ro = ro_next; <stage ro + 1's loads> }
//!   }
//!   <inner product>
//!   __syncthreads();
//! }
//! ```
//!
//! so that the next stage's global loads are in flight while this stage's inner product
//! runs. The next stage's addresses are the stage's own statements re-run in a C block
//! that rebinds the loop counter (`Stmt::Block` ends the shadowing), so the loads cannot
//! drift from the fetches they replace.
//!
//! It is a pass over the IR rather than a way of printing it so that the CPU interpreter
//! runs exactly the kernel that is compiled (registers, barriers and all). Validation
//! (`prefetch_feasible`) guarantees what the pass needs: the fetch loops are unrolled
//! (register slots must be compile-time indices) and a block runs at least two stages.

use crate::ir::{Cond, Expr, Kernel, Scope, Stmt, Var};

/// Applies register prefetch to every stage loop of `kernel` (a loop whose body holds a
/// barrier outside any inner loop); the rest of the nest is unchanged.
pub fn register_prefetch(mut kernel: Kernel) -> Kernel {
    let body = std::mem::take(&mut kernel.body);
    let mut arrays = 0;
    kernel.body = transform(&mut kernel.scope, &body, &mut arrays);
    kernel
}

/// The statements with every stage loop prefetched; `arrays` numbers the register
/// arrays declared so far.
fn transform(scope: &mut Scope, stmts: &[Stmt], arrays: &mut usize) -> Vec<Stmt> {
    let mut out = Vec::new();
    for stmt in stmts {
        match stmt {
            Stmt::For {
                var,
                extent,
                unroll,
                body,
            } if contains_sync(body) => {
                out.extend(prefetch_loop(scope, (*var, *extent, *unroll), body, arrays));
            }
            Stmt::For {
                var,
                extent,
                unroll,
                body,
            } => out.push(Stmt::For {
                var: *var,
                extent: *extent,
                unroll: *unroll,
                body: transform(scope, body, arrays),
            }),
            Stmt::If { conds, body } => out.push(Stmt::If {
                conds: conds.clone(),
                body: transform(scope, body, arrays),
            }),
            Stmt::Block { body } => out.push(Stmt::Block {
                body: transform(scope, body, arrays),
            }),
            other => out.push(other.clone()),
        }
    }
    out
}

/// What a fetch statement becomes in one copy of the stage's fetch part.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Global memory into the registers (the stage ahead).
    Load,
    /// The registers into shared memory (this stage).
    Store,
}

/// The stage loop `for (var < extent) body` with register prefetch: the register
/// arrays, stage 0's loads, and the loop whose iterations store, synchronize, load the
/// next stage and compute.
fn prefetch_loop(
    scope: &mut Scope,
    (var, extent, unroll): (Var, i64, bool),
    body: &[Stmt],
    arrays: &mut usize,
) -> Vec<Stmt> {
    let first = *arrays;
    let mut slots = Vec::new();
    fetch_slots(body, 1, &mut slots);
    *arrays += slots.len();
    let mut out: Vec<Stmt> = slots
        .iter()
        .enumerate()
        .map(|(k, &(width, len))| Stmt::Registers {
            array: first + k,
            width,
            len,
        })
        .collect();

    let mut prelude = vec![Stmt::Let {
        var,
        value: Expr::Const(0),
    }];
    // Each copy of the fetch part numbers its fetches from the loop's first array.
    let loads = |scope: &Scope| phase(scope, body, Phase::Load, &mut Vec::new(), &mut { first });
    prelude.extend(loads(scope));
    out.push(Stmt::Block { body: prelude });

    // The next stage's loads: `ro_next` carries the counter into the block that
    // rebinds it, where the stage's own statements compute the next stage's addresses.
    let next = scope.add(Expr::Var(var), Expr::Const(1));
    let name = format!("{}_next", scope.vars[var.0].name);
    let next_var = scope.var(&name, 1, extent - 1);
    let mut shadowed = vec![Stmt::Let {
        var,
        value: Expr::Var(next_var),
    }];
    shadowed.extend(loads(scope));
    let load_next = Stmt::If {
        conds: vec![Cond {
            expr: next.clone(),
            lo: None,
            hi: Some(extent),
        }],
        body: vec![
            Stmt::Let {
                var: next_var,
                value: next,
            },
            Stmt::Block { body: shadowed },
        ],
    };
    let mut array = first;
    let iteration = stage_with_prefetch(scope, body, &load_next, &mut array);
    out.push(Stmt::For {
        var,
        extent,
        unroll,
        body: iteration,
    });
    out
}

/// One iteration: this stage's stores from the registers, the barrier that publishes
/// them, `load_next`, then the rest of the stage as it was. A tail guard around the
/// stage (split-K) stays around all of it.
fn stage_with_prefetch(
    scope: &Scope,
    stmts: &[Stmt],
    load_next: &Stmt,
    array: &mut usize,
) -> Vec<Stmt> {
    let mut out = Vec::new();
    let mut computing = false;
    for stmt in stmts {
        if computing {
            out.push(stmt.clone());
            continue;
        }
        match stmt {
            Stmt::If { conds, body } if contains_sync(body) => out.push(Stmt::If {
                conds: conds.clone(),
                body: stage_with_prefetch(scope, body, load_next, array),
            }),
            Stmt::Sync => {
                out.push(Stmt::Sync);
                out.push(load_next.clone());
                computing = true;
            }
            _ => out.extend(phase(
                scope,
                std::slice::from_ref(stmt),
                Phase::Store,
                &mut Vec::new(),
                array,
            )),
        }
    }
    out
}

/// The fetch part of a stage (up to its first barrier) in one phase. `loops` are the
/// enclosing fetch loops (variable, extent), which index the register slots; `array`
/// numbers the fetch statements. The load phase keeps only what the loads need (the
/// bindings, fetch loops and guards); the store phase keeps everything.
fn phase(
    scope: &Scope,
    stmts: &[Stmt],
    which: Phase,
    loops: &mut Vec<(Var, i64)>,
    array: &mut usize,
) -> Vec<Stmt> {
    let mut out = Vec::new();
    for stmt in stmts {
        match stmt {
            Stmt::Sync => break,
            Stmt::Let { .. } => out.push(stmt.clone()),
            Stmt::Fetch { read, write } => {
                let slot = slot(scope, loops);
                out.push(match which {
                    Phase::Load => Stmt::RegisterLoad {
                        array: *array,
                        slot,
                        read: read.clone(),
                    },
                    Phase::Store => Stmt::RegisterStore {
                        array: *array,
                        slot,
                        write: write.clone(),
                    },
                });
                *array += 1;
            }
            Stmt::For {
                var,
                extent,
                unroll,
                body,
            } if contains_fetch(body) => {
                loops.push((*var, *extent));
                let body = phase(scope, body, which, loops, array);
                loops.pop();
                out.push(Stmt::For {
                    var: *var,
                    extent: *extent,
                    unroll: *unroll,
                    body,
                });
            }
            Stmt::If { conds, body } if contains_fetch(body) || contains_sync(body) => {
                out.push(Stmt::If {
                    conds: conds.clone(),
                    body: phase(scope, body, which, loops, array),
                });
            }
            _ if which == Phase::Store => out.push(stmt.clone()),
            _ => {}
        }
    }
    out
}

/// The register slot of a fetch inside `loops`: their iteration, row-major.
fn slot(scope: &Scope, loops: &[(Var, i64)]) -> Expr {
    loops.iter().fold(Expr::Const(0), |acc, &(var, extent)| {
        scope.add(scope.mul(acc, extent), Expr::Var(var))
    })
}

/// The fetch statements of a stage (before its first barrier), in order: (vector
/// width, register slots) each.
fn fetch_slots(stmts: &[Stmt], loops: i64, out: &mut Vec<(u32, i64)>) {
    for stmt in stmts {
        match stmt {
            Stmt::Sync => return,
            Stmt::Fetch { read, .. } => out.push((read.width, loops)),
            Stmt::For { extent, body, .. } if contains_fetch(body) => {
                fetch_slots(body, loops * extent, out);
            }
            Stmt::If { body, .. } if contains_fetch(body) || contains_sync(body) => {
                fetch_slots(body, loops, out);
            }
            _ => {}
        }
    }
}

/// Whether a barrier is among `stmts` or in their branches (not inside inner loops).
fn contains_sync(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match s {
        Stmt::Sync => true,
        Stmt::If { body, .. } | Stmt::Block { body } => contains_sync(body),
        _ => false,
    })
}

fn contains_fetch(stmts: &[Stmt]) -> bool {
    let mut found = false;
    Stmt::walk(stmts, &mut |s| found |= matches!(s, Stmt::Fetch { .. }));
    found
}
