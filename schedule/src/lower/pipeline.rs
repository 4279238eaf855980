//! The `stages`-deep ring of shared buffers through which a reduction streams its
//! tiles, built once for every sketch that pipelines its fill: a prologue that issues
//! tiles `0..stages-1`, then per iteration `t`: wait until tile `t` has landed (and
//! every consumer is done with the buffer tile `t + stages - 1` overwrites), issue that
//! tile, consume tile `t` from buffer `t % stages`. One stage is the plain loop: fill,
//! wait, consume, and wait again before the next fill overwrites the buffer.
//!
//! How a stage is handed from the copies to the consumers is the [`Handoff`]: `cp.async`
//! groups (commit after a stage's copies; `wait_group` on all but the newest in flight,
//! then a barrier). The `wgmma` sketch's mbarrier ring (`lower::wgmma`) is not a
//! `Handoff`: its consumers release a buffer one MMA group after reading it, its
//! producer may be a warp of its own, and its iterations run on across output tiles,
//! none of which this ring's one-role iteration expresses.

use super::common::{guarded, var_or_zero, wrap_loops};
use crate::ir::{Expr, Scope, Stmt};

/// How a stage's data reaches its consumers.
pub(crate) trait Handoff {
    /// After a stage's copies are issued (even when the tile does not exist, so that
    /// the count of issued stages stays the iteration's).
    fn issued(&self, out: &mut Vec<Stmt>);
    /// Before consuming the oldest stage in flight, while `pending` newer ones may
    /// still be landing: it has landed and every thread sees it.
    fn landed(&self, out: &mut Vec<Stmt>, pending: u32);
    /// After consuming a stage that the next fill overwrites at once (one stage).
    fn consumed(&self, out: &mut Vec<Stmt>);
}

/// `cp.async` groups: one group per stage, `wait_group` then a block barrier.
pub(crate) struct CpAsyncGroups;

impl Handoff for CpAsyncGroups {
    fn issued(&self, out: &mut Vec<Stmt>) {
        out.push(Stmt::CommitGroup);
    }
    fn landed(&self, out: &mut Vec<Stmt>, pending: u32) {
        out.push(Stmt::WaitGroup { pending });
        out.push(Stmt::Sync);
    }
    fn consumed(&self, out: &mut Vec<Stmt>) {
        out.push(Stmt::Sync);
    }
}

/// What a pipelined lowering supplies: its scope, the fill of a tile into its buffer
/// and the consumption of a tile from a buffer.
pub(crate) trait Stages {
    fn scope(&mut self) -> &mut Scope;
    /// Issues the copies of local tile `local` (into buffer `local % stages`).
    fn fill(&mut self, local: Expr, out: &mut Vec<Stmt>);
    /// Consumes local tile `local` from buffer `stage`.
    fn consume(&mut self, local: Expr, stage: Expr, out: &mut Vec<Stmt>);
}

/// The ring over `tiles` local tiles with `stages` buffers: the prologue goes to
/// `prologue`, the loop (counter `kt`) is returned.
pub(crate) fn ring(
    lowering: &mut impl Stages,
    handoff: &impl Handoff,
    stages: i64,
    tiles: i64,
    prologue: &mut Vec<Stmt>,
) -> Vec<Stmt> {
    let kt = (tiles > 1).then(|| lowering.scope().var("kt", 0, tiles - 1));
    let ktv = var_or_zero(kt);
    let mut iteration = Vec::new();
    if stages == 1 {
        lowering.fill(ktv.clone(), &mut iteration);
        handoff.issued(&mut iteration);
        handoff.landed(&mut iteration, 0);
        lowering.consume(ktv.clone(), Expr::Const(0), &mut iteration);
        handoff.consumed(&mut iteration);
    } else {
        for s in 0..stages - 1 {
            if s < tiles {
                lowering.fill(Expr::Const(s), prologue);
            }
            handoff.issued(prologue);
        }
        handoff.landed(&mut iteration, (stages - 2) as u32);
        let next = lowering.scope().add(ktv.clone(), Expr::Const(stages - 1));
        let mut issue = Vec::new();
        lowering.fill(next.clone(), &mut issue);
        let exists = lowering.scope().bound(&next, 0, tiles);
        guarded(&mut iteration, exists, issue, false);
        handoff.issued(&mut iteration);
        let stage = lowering.scope().rem(ktv.clone(), stages);
        lowering.consume(ktv, stage, &mut iteration);
    }
    wrap_loops(&[kt], &[tiles], |_| false, iteration)
}
