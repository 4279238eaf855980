//! Simulated annealing at a measurement budget: propose a random slide (an instruction
//! moved 1–8 slots; the estimate's best-ranked moves are proposed more often), measure,
//! accept a slower order with probability `exp(−Δ/T)` where the temperature falls
//! linearly from 1% of the baseline time to zero over the budget.

use crate::SassError;
use crate::agents::estimate::{ranked, slide};
use crate::agents::objective::{Evaluation, Objective};
use crate::legality::analysis::Kernel;
use crate::legality::order::Order;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Anneals from the original order; the objective tracks the best.
pub fn anneal(
    kernel: &Kernel,
    objective: &mut dyn Objective,
    start_us: f64,
    seed: u64,
) -> Result<(), SassError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut uniform = move || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let mut current = Order::identity(kernel.len());
    let mut current_us = start_us;
    let t0 = 0.01 * start_us;
    let budget = objective.budget().max(1) as f64;
    let mut stale = 0;
    while !objective.exhausted() && stale < 64 {
        let moves = ranked(kernel, &current);
        if moves.is_empty() {
            break;
        }
        // Half the proposals come from the best-ranked eighth.
        let pool = if uniform() < 0.5 {
            moves.len().div_ceil(8)
        } else {
            moves.len()
        };
        let (action, _) = moves[(uniform() * pool as f64) as usize % pool];
        let length = 1 + (uniform() * 8.0) as usize;
        let Some((candidate, _, _)) = slide(kernel, &current, action, length, false) else {
            stale += 1;
            continue;
        };
        let before = objective.used();
        let evaluation = objective.evaluate(kernel, &candidate)?;
        stale = if objective.used() == before {
            stale + 1
        } else {
            0
        };
        let Evaluation::Time(t) = evaluation else {
            continue;
        };
        let temperature = t0 * (1.0 - objective.used() as f64 / budget);
        let accept = t < current_us
            || (temperature > 0.0 && uniform() < (-(t - current_us) / temperature).exp());
        if accept {
            current = candidate;
            current_us = t;
        }
    }
    Ok(())
}
