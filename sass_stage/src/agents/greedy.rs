//! Greedy hill climbing at a measurement budget: take the current candidate's
//! neighbours (slides of memory instructions and control-bit patterns, `candidates`),
//! measure them in the guide's order (by the edit model's predicted gain when guided,
//! skipping predicted losses), move to the first that is faster, and stop at a local
//! optimum or when the budget is spent.

use crate::SassError;
use crate::agents::candidates::neighbours;
use crate::agents::model::Guide;
use crate::agents::objective::{Evaluation, Objective, text_hash};
use crate::legality::analysis::Kernel;
use crate::legality::order::Order;
use std::collections::HashSet;

/// A candidate must beat the current time by this fraction to be kept (timing noise).
pub const MIN_GAIN: f64 = 0.002;

/// Climbs from the original order; the objective tracks the best.
pub fn climb(
    kernel: &Kernel,
    objective: &mut dyn Objective,
    start_us: f64,
    guide: &mut Guide,
    seed: u64,
) -> Result<(), SassError> {
    let mut current = Order::identity(kernel.len());
    let mut current_us = start_us;
    let mut tried: HashSet<String> = HashSet::new();
    tried.insert(text_hash(kernel, &current));
    let mut round = 0u64;
    'outer: while !objective.exhausted() {
        let candidates = neighbours(kernel, &current, seed.wrapping_add(round));
        round += 1;
        let current_prediction = guide.predict(kernel, &current);
        for (candidate, predicted) in guide.rank(kernel, candidates) {
            if !tried.insert(text_hash(kernel, &candidate.order)) {
                continue;
            }
            if guide.skip(predicted, current_prediction) {
                continue;
            }
            if objective.exhausted() {
                break 'outer;
            }
            let evaluation = objective.evaluate(kernel, &candidate.order)?;
            guide.observe(kernel, &candidate.order, &evaluation);
            if let Evaluation::Time(t) = evaluation
                && t < current_us * (1.0 - MIN_GAIN)
            {
                current = candidate.order;
                current_us = t;
                continue 'outer;
            }
        }
        break; // No untried neighbour helps: a local optimum.
    }
    Ok(())
}
