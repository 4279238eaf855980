//! Ansor's evolutionary search, one proposal per measurement round: a population of
//! 2048 states (20% seeded from the best measured ones, the rest sampled), 4 generations
//! of score-proportional selection and mutation (probability 0.85) scored by the cost
//! model, then the best-scored unmeasured states seen in any generation, with 5% of the
//! round left to fresh random samples (eps-greedy) so the model keeps seeing the space.
//!
//! The model does not change during a proposal, so each distinct state is scored once
//! (selection copies the fittest parents many times: a population converges to far
//! fewer distinct states than its size), and features are extracted on every core: on
//! the 2-core development machine, features were about half of a proposal's time.

use crate::mutate::mutate;
use costmodel::CostModel;
use features::FeatureExtractor;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::Rng;
use rayon::prelude::*;
use schedule::task::Contraction;
use schedule::{GpuSpec, Sampler, State};
use std::collections::{HashMap, HashSet};

/// Ansor's defaults.
#[derive(Debug, Clone, Copy)]
pub struct EvolutionParams {
    pub population: usize,
    pub generations: usize,
    pub mutation_prob: f64,
    pub eps_greedy: f64,
    /// Share of the initial population taken from the best measured states.
    pub measured_share: f64,
}

impl Default for EvolutionParams {
    fn default() -> Self {
        EvolutionParams {
            population: 2048,
            generations: 4,
            mutation_prob: 0.85,
            eps_greedy: 0.05,
            measured_share: 0.2,
        }
    }
}

/// Everything a proposal needs about one task.
pub struct TaskSpace<'a> {
    pub contraction: &'a Contraction,
    pub gpu: &'a GpuSpec,
    pub extractor: &'a FeatureExtractor,
}

/// Scores states with the model (features extracted in parallel, in order).
pub fn score<S: std::borrow::Borrow<State> + Sync>(
    space: &TaskSpace,
    model: &mut dyn CostModel,
    states: &[S],
) -> Vec<f32> {
    let rows: Vec<[f32; features::FEATURE_COUNT]> = states
        .par_iter()
        .map(|s| space.extractor.extract(s.borrow()))
        .collect();
    model.predict(rows.as_flattened())
}

fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Up to `n` unmeasured states for the next round.
#[allow(clippy::too_many_arguments)]
pub fn propose(
    n: usize,
    params: &EvolutionParams,
    space: &TaskSpace,
    sampler: &mut Sampler,
    rng: &mut ChaCha8Rng,
    measured: &HashSet<String>,
    best_measured: &[State],
    model: &mut dyn CostModel,
) -> Vec<State> {
    let seeded =
        ((params.population as f64 * params.measured_share) as usize).min(best_measured.len());
    let mut population: Vec<State> = best_measured[..seeded].to_vec();
    let mut misses = 0;
    while population.len() < params.population && misses < params.population {
        match sampler.sample() {
            Some(s) => population.push(s),
            None => misses += 1,
        }
    }
    // Every state seen, with its score.
    let mut scored: HashMap<State, f32> = HashMap::new();
    for generation in 0..=params.generations {
        let mut fresh: Vec<&State> = Vec::new();
        let mut seen: HashSet<&State> = HashSet::new();
        for s in &population {
            if !scored.contains_key(s) && seen.insert(s) {
                fresh.push(s);
            }
        }
        let fresh_scores = score(space, model, &fresh);
        for (s, sc) in fresh.into_iter().zip(fresh_scores) {
            scored.insert(s.clone(), sc);
        }
        let scores: Vec<f32> = population.iter().map(|s| scored[s]).collect();
        if generation == params.generations || population.is_empty() {
            break;
        }
        // Score-proportional selection over non-negative weights.
        let weights: Vec<f64> = scores
            .iter()
            .map(|&s| f64::from(s.max(0.0)) + 1e-6)
            .collect();
        let total: f64 = weights.iter().sum();
        let mut next = Vec::with_capacity(params.population);
        let mut attempts = 0;
        while next.len() < params.population && attempts < 4 * params.population {
            attempts += 1;
            let mut x = uniform(rng) * total;
            let parent = weights
                .iter()
                .position(|&w| {
                    x -= w;
                    x <= 0.0
                })
                .unwrap_or(weights.len() - 1);
            if uniform(rng) < params.mutation_prob {
                if let Some(m) = mutate(&population[parent], space.contraction, space.gpu, rng) {
                    next.push(m);
                }
            } else {
                next.push(population[parent].clone());
            }
        }
        population = next;
    }
    let random_share = ((n as f64) * params.eps_greedy).ceil() as usize;
    let mut ranked: Vec<(String, State, f32)> = scored
        .into_iter()
        .map(|(s, sc)| (s.id(), s, sc))
        .filter(|(id, _, _)| !measured.contains(id))
        .collect();
    ranked.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    ranked.truncate(n.saturating_sub(random_share));
    let mut ids = HashSet::new();
    let mut chosen: Vec<State> = Vec::with_capacity(n);
    for (id, s, _) in ranked {
        ids.insert(id);
        chosen.push(s);
    }
    let mut misses = 0;
    while chosen.len() < n && misses < 50 * n.max(1) {
        match sampler.sample() {
            Some(s) if !measured.contains(&s.id()) && ids.insert(s.id()) => chosen.push(s),
            Some(_) => misses += 1,
            None => break,
        }
    }
    chosen
}
