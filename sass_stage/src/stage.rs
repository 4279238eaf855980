//! Stage 2 on one kernel: run each agent at the same measurement budget, validate each
//! agent's best order on further inputs, time the survivors and the stage-1 order side
//! by side in alternating rounds, and keep the fastest (the stage-1 order when nothing
//! beats it). The result says what each agent found, what the winner moved, and the
//! instruction-order diff.

use crate::SassError;
use crate::agents::env::MeasuredGame;
use crate::agents::model::{EditModel, Guide};
use crate::agents::objective::{Evaluation, Objective, Tracker};
use crate::agents::ppo::{PpoConfig, train};
use crate::legality::analysis::Kernel;
use crate::legality::order::Order;
use crate::legality::profile::IssueProfile;
use crate::measure::{GpuObjective, Target};
use gpu::Pool;
use serde::Serialize;
use std::collections::BTreeMap;

/// Smallest relative gain over stage 1 that counts (below it, run-to-run noise of the
/// median of medians on an H100 is of the same size).
pub const MIN_GAIN: f64 = 0.005;

/// A search agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    Ppo,
    Greedy,
    Anneal,
    /// Greedy ranking its candidates by the edit model.
    GreedyModel,
    /// Annealing drawing from the candidates the edit model ranks best.
    AnnealModel,
}

impl AgentKind {
    pub fn name(self) -> &'static str {
        match self {
            AgentKind::Ppo => "ppo",
            AgentKind::Greedy => "greedy",
            AgentKind::Anneal => "anneal",
            AgentKind::GreedyModel => "greedy-model",
            AgentKind::AnnealModel => "anneal-model",
        }
    }

    /// Whether the agent follows the edit model (PPO uses it as a filter when trained).
    pub fn guided(self) -> bool {
        matches!(
            self,
            AgentKind::GreedyModel | AgentKind::AnnealModel | AgentKind::Ppo
        )
    }
}

/// Settings of the stage.
#[derive(Debug, Clone)]
pub struct StageConfig {
    pub agents: Vec<AgentKind>,
    /// Distinct measurements per agent (the baseline's included).
    pub budget: usize,
    pub seed: u64,
    /// Alternating rounds of the final comparison.
    pub rounds: usize,
    /// Further input seeds each finalist is checked on.
    pub validation_seeds: Vec<u64>,
}

/// What one agent did.
#[derive(Debug, Clone, Serialize)]
pub struct AgentResult {
    pub agent: AgentKind,
    pub measurements: usize,
    pub failures: Vec<String>,
    /// Best time seen during its search (single measurements).
    pub search_best_us: f64,
    /// Best-so-far after each measurement.
    pub curve: Vec<f64>,
    /// Its best order failed the extra validation (then it is not a finalist).
    pub rejected: Option<String>,
    /// Median over the final rounds; `None` if rejected.
    pub final_us: Option<f64>,
    pub moved: usize,
    /// What its best candidate changed, by kind (`Kernel::edit_counts`).
    pub actions: BTreeMap<String, usize>,
    /// Measurements until its best-so-far came within 0.5% of its final best.
    pub measurements_to_best: usize,
    /// Candidates the edit model kept it from measuring.
    pub skipped_by_model: usize,
    #[serde(skip)]
    pub order: Order,
}

/// One moved instruction of the chosen order.
#[derive(Debug, Clone, Serialize)]
pub struct Moved {
    pub text: String,
    pub from: usize,
    pub to: usize,
}

/// One stage-1 kernel of a task under `--top-k`: its own stage-1 time and its final
/// candidate's time in the task's side-by-side rounds.
#[derive(Debug, Clone, Serialize)]
pub struct RankTimes {
    pub rank: usize,
    pub stage1_us: f64,
    pub final_us: f64,
}

/// Stage 2 of one kernel.
#[derive(Debug, Clone, Serialize)]
pub struct KernelResult {
    pub kernel: String,
    pub instructions: usize,
    pub movable: usize,
    pub legal_at_start: usize,
    /// Stage-1 order, median over the final rounds.
    pub stage1_us: f64,
    pub agents: Vec<AgentResult>,
    /// The winning agent, or `None` when the stage-1 order stays.
    pub winner: Option<AgentKind>,
    pub final_us: f64,
    pub speedup: f64,
    /// Exact checks run on the GPU, all agents and the final validation together.
    pub validations: usize,
    pub explain: Vec<Moved>,
    /// The winner's control-bit edits, one line per instruction.
    pub control_edits: Vec<String>,
    /// Which of the task's stage-1 kernels (0: the fastest) the final kernel came from.
    pub stage1_rank: usize,
    /// Each stage-1 kernel's times when several ran (`--top-k`).
    pub ranks: Vec<RankTimes>,
    /// What the winner changed, by kind.
    pub actions: BTreeMap<String, usize>,
    /// Where the stage-1 kernel's hot loop spends its issue cycles.
    pub hot_loop: IssueProfile,
    #[serde(skip)]
    pub order: Order,
}

/// Runs the stage on `kernel`. Each agent starts from a copy of `model` (rows of
/// earlier kernels and runs); the rows every agent measured are added to it.
pub fn optimize(
    kernel: &Kernel,
    pool: &mut Pool,
    target: &Target,
    config: &StageConfig,
    model: &mut EditModel,
) -> Result<KernelResult, SassError> {
    let mut learned = Vec::new();
    let identity = Order::identity(kernel.len());
    let mut agents = Vec::new();
    let mut validations = 0;
    for (k, &agent) in config.agents.iter().enumerate() {
        let mut objective = GpuObjective::new(pool, target, config.budget);
        let seed = config.seed.wrapping_add(k as u64);
        let mut agent_model = model.clone();
        let known = agent_model.rows.len();
        let (best, best_us, curve, failures, skipped) = {
            let mut tracker = Tracker::start(&mut objective, kernel)?;
            let start = tracker.baseline_us;
            let mut guide = Guide::new(&mut agent_model, agent.guided(), start);
            match agent {
                AgentKind::Greedy | AgentKind::GreedyModel => {
                    crate::agents::greedy::climb(kernel, &mut tracker, start, &mut guide, seed)?
                }
                AgentKind::Anneal | AgentKind::AnnealModel => {
                    crate::agents::anneal::anneal(kernel, &mut tracker, start, &mut guide, seed)?
                }
                AgentKind::Ppo => {
                    let budget = tracker.budget();
                    let mut game = MeasuredGame::new(kernel, &mut tracker, start, &mut guide);
                    let ppo = PpoConfig {
                        seed,
                        ..PpoConfig::default()
                    };
                    train(&mut game, &ppo, 16 * budget)?;
                }
            }
            let skipped = guide.skipped;
            (
                tracker.best,
                tracker.best_us,
                tracker.curve,
                tracker.failures,
                skipped,
            )
        };
        learned.extend(agent_model.rows.drain(known..));
        let measurements = objective.used();
        let rejected = if best != identity {
            let check = objective.validate(kernel, &best, &config.validation_seeds)?;
            check.err()
        } else {
            None
        };
        validations += objective.validations;
        let measurements_to_best = curve
            .iter()
            .position(|&t| t <= best_us * 1.005)
            .unwrap_or(0);
        agents.push(AgentResult {
            agent,
            measurements,
            failures,
            search_best_us: best_us,
            curve,
            rejected,
            final_us: None,
            moved: best.moved().len(),
            actions: kernel.edit_counts(&best),
            measurements_to_best,
            skipped_by_model: skipped,
            order: best,
        });
    }
    for row in learned {
        model.observe(row.features, row.gain);
    }

    // Final comparison: the stage-1 order and every validated finalist, alternating.
    let mut objective = GpuObjective::new(pool, target, 0);
    let mut finalists: Vec<Order> = vec![identity.clone()];
    for a in &agents {
        if a.rejected.is_none() && !finalists.contains(&a.order) {
            finalists.push(a.order.clone());
        }
    }
    let mut samples: Vec<Vec<f32>> = vec![Vec::new(); finalists.len()];
    for _ in 0..config.rounds.max(1) {
        for (f, order) in finalists.iter().enumerate() {
            match objective.time_fresh(kernel, order)? {
                Evaluation::Time(t) => samples[f].push(t as f32),
                Evaluation::Failed(why) => {
                    return Err(SassError::Gpu(format!(
                        "a validated order failed when timed again: {why}"
                    )));
                }
            }
        }
    }
    validations += objective.validations;
    // The tuner's median (times are µs to a thousandth: f32 holds them exactly enough).
    let medians: Vec<f64> = samples.iter().map(|s| gpu::timing::median(s)).collect();
    let stage1_us = medians[0];
    for a in &mut agents {
        if a.rejected.is_none() {
            let f = finalists
                .iter()
                .position(|o| *o == a.order)
                .expect("a finalist");
            a.final_us = Some(medians[f]);
        }
    }
    // A reordering replaces the stage-1 kernel only when it is faster by more than
    // the timing noise.
    let (mut winner, mut final_us, mut order) = (None, stage1_us, identity);
    for a in &agents {
        if let Some(t) = a.final_us
            && t < final_us
            && t < stage1_us * (1.0 - MIN_GAIN)
        {
            (winner, final_us, order) = (Some(a.agent), t, a.order.clone());
        }
    }
    Ok(KernelResult {
        kernel: kernel.name.clone(),
        instructions: kernel.len(),
        movable: kernel.instructions.iter().filter(|i| i.movable()).count(),
        legal_at_start: kernel
            .legal_mask(&Order::identity(kernel.len()))
            .iter()
            .filter(|&&l| l)
            .count(),
        stage1_us,
        agents,
        winner,
        final_us,
        speedup: stage1_us / final_us,
        validations,
        explain: explain(kernel, &order),
        control_edits: kernel.describe_edits(&order),
        stage1_rank: 0,
        ranks: Vec::new(),
        actions: kernel.edit_counts(&order),
        hot_loop: kernel.issue_profile(kernel.hot_block()),
        order,
    })
}

/// The moved memory instructions of `order`, farthest moved first.
pub fn explain(kernel: &Kernel, order: &Order) -> Vec<Moved> {
    let mut moved: Vec<Moved> = (0..kernel.len())
        .filter(|&i| kernel.instructions[i].movable() && order.position(i) != i)
        .map(|i| Moved {
            text: kernel.instructions[i].text.clone(),
            from: i,
            to: order.position(i),
        })
        .collect();
    moved.sort_by_key(|m| (std::cmp::Reverse(m.from.abs_diff(m.to)), m.from));
    moved
}

/// The instruction order as text, one line per position: new offset, original offset,
/// a mark on moved lines, and the instruction.
pub fn order_diff(kernel: &Kernel, order: &Order) -> String {
    let mut out = String::new();
    for p in 0..kernel.len() {
        let i = order.at(p);
        let mark = if i == p { ' ' } else { '*' };
        out.push_str(&format!(
            "/*{:04x}*/ {mark} from /*{:04x}*/  {}\n",
            p * 16,
            i * 16,
            kernel.instructions[i].text
        ));
    }
    out
}
