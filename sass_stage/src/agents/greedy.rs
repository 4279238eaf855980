//! Greedy hill climbing at a measurement budget: rank the legal moves by the analytical
//! estimate, slide the best-ranked instruction as far as it keeps helping, measure, keep
//! the result if it is faster, otherwise try the next; stop at a local optimum or when
//! the budget is spent.

use crate::SassError;
use crate::agents::estimate::{ranked, slide};
use crate::agents::objective::{Evaluation, Objective, text_hash};
use crate::legality::analysis::Kernel;
use crate::legality::order::Order;
use std::collections::HashSet;

/// Longest slide of one instruction per measurement.
pub const MAX_SLIDE: usize = 8;
/// A candidate must beat the current time by this fraction to be kept (timing noise).
pub const MIN_GAIN: f64 = 0.002;

/// Climbs from the original order; the objective tracks the best.
pub fn climb(
    kernel: &Kernel,
    objective: &mut dyn Objective,
    start_us: f64,
) -> Result<(), SassError> {
    let mut current = Order::identity(kernel.len());
    let mut current_us = start_us;
    let mut tried: HashSet<String> = HashSet::new();
    'outer: while !objective.exhausted() {
        for (action, value) in ranked(kernel, &current) {
            if value < 0 {
                break;
            }
            let Some((candidate, _, _)) = slide(kernel, &current, action, MAX_SLIDE, true) else {
                continue;
            };
            if !tried.insert(text_hash(kernel, &candidate)) {
                continue;
            }
            if objective.exhausted() {
                break 'outer;
            }
            if let Evaluation::Time(t) = objective.evaluate(kernel, &candidate)?
                && t < current_us * (1.0 - MIN_GAIN)
            {
                current = candidate;
                current_us = t;
                continue 'outer;
            }
        }
        break; // No untried move helps: a local optimum.
    }
    Ok(())
}
