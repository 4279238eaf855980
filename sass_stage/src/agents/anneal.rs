//! Simulated annealing at a measurement budget: propose a random neighbour of the
//! current candidate (a slide or a control-bit pattern, `candidates`; when guided, drawn
//! from the quarter the edit model ranks best), measure, accept a slower one with
//! probability `exp(−Δ/T)` where the temperature falls linearly from 1% of the baseline
//! time to zero over the budget.

use crate::SassError;
use crate::agents::candidates::neighbours;
use crate::agents::model::Guide;
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
    guide: &mut Guide,
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
        let candidates = neighbours(kernel, &current, (uniform() * 1e15) as u64);
        if candidates.is_empty() {
            break;
        }
        let ranked = guide.rank(kernel, candidates);
        let pool = if guide.active() {
            ranked.len().div_ceil(4)
        } else {
            ranked.len()
        };
        let (candidate, _) = &ranked[(uniform() * pool as f64) as usize % pool];
        let before = objective.used();
        let evaluation = objective.evaluate(kernel, &candidate.order)?;
        let fresh = objective.used() > before;
        stale = if fresh { 0 } else { stale + 1 };
        if fresh {
            guide.observe(kernel, &candidate.order, &evaluation);
        }
        let Evaluation::Time(t) = evaluation else {
            continue;
        };
        let temperature = t0 * (1.0 - objective.used() as f64 / budget);
        let accept = t < current_us
            || (temperature > 0.0 && uniform() < (-(t - current_us) / temperature).exp());
        if accept {
            current = candidate.order.clone();
            current_us = t;
        }
    }
    Ok(())
}
