//! An analytical estimate of a move's value, to choose what is worth measuring.
//!
//! A variable-latency load hides its latency behind the instructions issued between it
//! and the first instruction that waits on its scoreboard. Moving a load up over an
//! independent instruction adds that instruction's stall cycles to the load's cover;
//! the same swap takes cycles from a load that the moved instruction passes. The value
//! of an order is the sum over loads of their cover, each capped at the load's typical
//! latency (cover beyond the latency buys nothing); a move's value is the change.
//! Measurement decides; the estimate only ranks candidates (CuAsmRL measures every
//! step; this spends the GPU on moves that can plausibly help).

use crate::legality::analysis::Kernel;
use crate::legality::moves::{Action, Kind};
use crate::legality::order::Order;

/// Typical latency in cycles that cover is worth up to.
fn latency(base: &str) -> u32 {
    match base {
        "LDG" | "LD" | "LDL" | "LDGSTS" => 500,
        "LDS" | "LDSM" => 30,
        "LDC" | "ULDC" => 20,
        _ => 0,
    }
}

/// Stall cycles from the load at `position` to the first instruction waiting on its
/// write scoreboard (or to the end of its block), capped at its latency.
pub(crate) fn cover(kernel: &Kernel, order: &Order, position: usize) -> u32 {
    let ins = &kernel.instructions[order.at(position)];
    let cap = latency(&ins.base);
    let Some(barrier) = ins.control.write_barrier else {
        return 0;
    };
    if cap == 0 {
        return 0;
    }
    let block = &kernel.blocks[kernel.block_of[order.at(position)]];
    let mut cycles = 0;
    for p in position..block.end {
        if p > position && kernel.instructions[order.at(p)].control.waits_on(barrier) {
            break;
        }
        cycles += u32::from(kernel.control(order, order.at(p)).stall);
        if cycles >= cap {
            return cap;
        }
    }
    cycles.min(cap)
}

/// Estimated cycles of latency newly hidden by `action` (negative: exposed).
pub fn value(kernel: &Kernel, order: &Order, action: Action) -> i64 {
    let p = match action.kind {
        Kind::Up => action.row - 1,
        _ => action.row,
    };
    let before = i64::from(cover(kernel, order, p)) + i64::from(cover(kernel, order, p + 1));
    let mut after_order = order.clone();
    after_order.swap(p);
    let after =
        i64::from(cover(kernel, &after_order, p)) + i64::from(cover(kernel, &after_order, p + 1));
    after - before
}

/// Legal actions with their estimated value, best first (ties by action index, so the
/// ranking is deterministic).
pub fn ranked(kernel: &Kernel, order: &Order) -> Vec<(Action, i64)> {
    let mut out: Vec<(Action, i64)> = kernel
        .legal_mask_of(order, &[Kind::Up, Kind::Down])
        .iter()
        .enumerate()
        .filter(|&(_, &l)| l)
        .map(|(i, _)| {
            let a = Action::from_index(i);
            (a, value(kernel, order, a))
        })
        .collect();
    out.sort_by_key(|&(a, v)| (-v, a.index()));
    out
}

/// A macro move: the instruction at `row` moves up to `max` slots in `direction`, one
/// legal swap at a time, stopping where the next swap is illegal or (with
/// `only_gains`) estimated not to help. Returns the new order, its new row and the
/// total estimated value, or `None` if not even one swap was possible.
pub fn slide(
    kernel: &Kernel,
    order: &Order,
    action: Action,
    max: usize,
    only_gains: bool,
) -> Option<(Order, usize, i64)> {
    let mut current = order.clone();
    let mut row = action.row;
    let mut total = 0;
    let mut moved = 0;
    while moved < max {
        let step = Action {
            row,
            kind: action.kind,
        };
        if !kernel.legal(&current, step) {
            break;
        }
        let v = value(kernel, &current, step);
        if only_gains && v <= 0 && moved > 0 {
            break;
        }
        kernel.apply(&mut current, step);
        total += v;
        moved += 1;
        row = match action.kind {
            Kind::Up => row - 1,
            _ => row + 1,
        };
    }
    (moved > 0).then_some((current, row, total))
}
