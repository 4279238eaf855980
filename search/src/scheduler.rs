//! The task scheduler: which task of a network gets the next measurement round.
//!
//! Ansor's gradient allocation (OSDI'20 §6; parameters from its task scheduler): after a
//! warm-up round per task, pick the task whose next round is expected to reduce the
//! network's weighted latency sum the most. For task i with weight w_i (its count in the
//! network) and best latency history:
//! - backward gradient: the change of its best latency over the last 3 rounds, per round;
//! - forward gradient: the expected change of one more round, the larger reduction of
//!   `best / rounds` (diminishing returns) and of reaching β × the time it would take
//!   at the best FLOP rate any task of the same operator achieved (β = 2);
//! - gradient = w_i · (α · backward + (1 − α) · forward), α = 0.2; the most negative wins.
//!
//! A task without a correct kernel yet counts as 1e10 µs, so it is tried again soon.
//!
//! Per-task early stopping (TVM's `per_task_early_stopping`): a task whose best has not
//! improved by at least 1% over its last `patience` measured trials gets no more rounds
//! while any other task still can use them; when every eligible task has stalled, all
//! are eligible again, so the budget is always spent. Without it the forward gradient
//! of a task far below the best FLOP rate of its operator (a memory-bound 1x1 layer
//! next to compute-bound 3x3s) never fades: in a 20-minute ResNet run on an H100 one
//! such layer (1024→512, stride 2) took 6144 of 11712 trials and last improved at its
//! 1118th, while the layers that were still improving got 320 each.
//!
//! A floor (`with_floor`, on by default in `tune` at `DEFAULT_FLOOR`): a task that still
//! improves and has been planned fewer than that share of the mean rounds per task gets
//! the next round, the furthest behind first. The latency objective spends where the
//! most microseconds are expected to fall, so a mid-size task beside large ones starves:
//! on an H100 a 74 µs GEMM beside 480 µs ones got 64 trials in a 250 s tune and ended
//! at 0.54x cuBLAS, while the large ones got 384-448 each. With a floor of half the mean,
//! no task improving gets under half an even share, and the large ones keep at least
//! half of what they had.

/// What the scheduler minimizes over a network's tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Objective {
    /// The weighted sum of the tasks' latencies (Ansor's): rounds go where the most
    /// microseconds are expected to go.
    #[default]
    Latency,
    /// The weighted sum of their logarithms, i.e. the weighted geometric mean of the
    /// latencies (and so of the speedups over any fixed baseline): rounds go where the
    /// largest relative gain is expected, so short layers are not starved. Not the
    /// default: in one pair of 20-minute ResNet runs on an H100 it reached a 1.96x
    /// geometric-mean speedup over cuDNN where `Latency` reached 2.01x.
    LogLatency,
}

/// Ansor's constants.
const ALPHA: f64 = 0.2;
const BETA: f64 = 2.0;
const WINDOW: usize = 3;
const NO_KERNEL_US: f64 = 1e10;
/// The smallest relative gain that counts as an improvement for early stopping.
const MIN_GAIN: f64 = 0.01;
/// The floor `tune` uses: half the mean rounds per task.
pub const DEFAULT_FLOOR: f64 = 0.5;

/// One task as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct SchedTask {
    pub weight: f64,
    pub flops: f64,
    /// Tasks of the same operator are "similar" for the forward gradient.
    pub op: &'static str,
}

#[derive(Debug, Clone)]
pub struct TaskScheduler {
    tasks: Vec<SchedTask>,
    /// Rounds planned per task (warm-up counts plans, not results).
    planned: Vec<usize>,
    /// Best latency after each observed round.
    history: Vec<Vec<f64>>,
    /// Trials without an improvement after which a task stalls (None: never).
    patience: Option<usize>,
    /// Per task: the best at its last improvement, and the trials measured since.
    mark: Vec<(f64, usize)>,
    objective: Objective,
    /// Share of the mean rounds per task below which a task that still improves gets
    /// the next round (0: no floor).
    floor: f64,
}

impl TaskScheduler {
    pub fn new(tasks: Vec<SchedTask>) -> Self {
        let n = tasks.len();
        TaskScheduler {
            tasks,
            planned: vec![0; n],
            history: vec![Vec::new(); n],
            patience: None,
            mark: vec![(NO_KERNEL_US, 0); n],
            objective: Objective::Latency,
            floor: 0.0,
        }
    }

    /// Gives the next round to a task that still improves and has fewer than `share`
    /// of the mean rounds per task (see the module doc).
    pub fn with_floor(mut self, share: f64) -> Self {
        self.floor = share.max(0.0);
        self
    }

    /// Whether task `i` is below the floor.
    fn below_floor(&self, i: usize) -> bool {
        let mean = self.planned.iter().sum::<usize>() as f64 / self.tasks.len().max(1) as f64;
        (self.planned[i] as f64) < self.floor * mean
    }

    /// Minimizes `objective` instead of the latency sum.
    pub fn with_objective(mut self, objective: Objective) -> Self {
        self.objective = objective;
        self
    }

    /// Stops giving rounds to a task after `trials` measurements without a 1% gain
    /// while other tasks can use them.
    pub fn with_patience(mut self, trials: Option<usize>) -> Self {
        self.patience = trials;
        self
    }

    /// Whether task `i` has gone `patience` trials without improving.
    pub fn stalled(&self, i: usize) -> bool {
        self.patience.is_some_and(|p| self.mark[i].1 >= p)
    }

    fn best(&self, i: usize) -> f64 {
        self.history[i].last().copied().unwrap_or(NO_KERNEL_US)
    }

    /// The gradient of task `i` (negative: a round is expected to help).
    pub fn gradient(&self, i: usize) -> f64 {
        let h = &self.history[i];
        let best = self.best(i);
        let backward = if h.len() > WINDOW {
            (h[h.len() - 1] - h[h.len() - 1 - WINDOW]) / WINDOW as f64
        } else {
            0.0
        };
        let rounds = h.len().max(1) as f64;
        let diminishing = best - best / rounds;
        let best_rate = (0..self.tasks.len())
            .filter(|&j| self.tasks[j].op == self.tasks[i].op && self.best(j) < NO_KERNEL_US)
            .map(|j| self.tasks[j].flops / self.best(j))
            .fold(0.0, f64::max);
        let similar = if best_rate > 0.0 {
            BETA * self.tasks[i].flops / best_rate
        } else {
            f64::INFINITY
        };
        let forward = diminishing.min(similar) - best;
        let change = self.tasks[i].weight * (ALPHA * backward + (1.0 - ALPHA) * forward);
        match self.objective {
            // d(w log g) = w dg / g; a task without a kernel keeps its huge gradient.
            Objective::LogLatency if best < NO_KERNEL_US => change / best,
            _ => change,
        }
    }

    /// The next task among `eligible` ones: warm-up first, then the steepest gradient
    /// (ties to the lowest index).
    pub fn next(&mut self, eligible: &[bool]) -> Option<usize> {
        let mut candidates: Vec<usize> = (0..self.tasks.len()).filter(|&i| eligible[i]).collect();
        if candidates.iter().any(|&i| !self.stalled(i)) {
            candidates.retain(|&i| !self.stalled(i));
        }
        let chosen = candidates
            .iter()
            .copied()
            .find(|&i| self.planned[i] == 0)
            .or_else(|| {
                candidates
                    .iter()
                    .copied()
                    .filter(|&i| !self.stalled(i) && self.below_floor(i))
                    .min_by_key(|&i| self.planned[i])
            })
            .or_else(|| {
                candidates
                    .iter()
                    .copied()
                    .min_by(|&a, &b| self.gradient(a).total_cmp(&self.gradient(b)))
            })?;
        self.planned[chosen] += 1;
        Some(chosen)
    }

    /// Records the best latency of task `i` after one of its rounds of `trials`
    /// measurements.
    pub fn observe(&mut self, i: usize, best_us: Option<f64>, trials: usize) {
        let best = best_us.unwrap_or(NO_KERNEL_US);
        self.history[i].push(best);
        self.advance(i, best, trials);
    }

    /// Records task `i`'s measurements of an earlier run (a resumed log), in their
    /// order, as one round: the best so far after each.
    pub fn replay(&mut self, i: usize, results: impl IntoIterator<Item = Option<f64>>) {
        let mut best = NO_KERNEL_US;
        for us in results {
            best = us.map_or(best, |u| best.min(u));
            self.advance(i, best, 1);
        }
        self.history[i].push(best);
    }

    fn advance(&mut self, i: usize, best: f64, trials: usize) {
        let (mark, since) = &mut self.mark[i];
        if best < *mark * (1.0 - MIN_GAIN) {
            *mark = best;
            *since = 0;
        } else {
            *since += trials;
        }
    }

    pub fn rounds(&self, i: usize) -> usize {
        self.planned[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(weights: &[f64]) -> TaskScheduler {
        TaskScheduler::new(
            weights
                .iter()
                .map(|&w| SchedTask {
                    weight: w,
                    flops: 1e9,
                    op: "conv2d",
                })
                .collect(),
        )
    }

    #[test]
    fn warm_up_visits_every_task_once_in_order() {
        let mut s = sched(&[1.0, 1.0, 1.0]);
        let all = [true; 3];
        assert_eq!(
            (s.next(&all), s.next(&all), s.next(&all)),
            (Some(0), Some(1), Some(2))
        );
        assert_eq!(s.next(&[false, false, false]), None);
    }

    #[test]
    fn rounds_go_where_the_weighted_latency_falls_fastest() {
        // Task 0 is stuck at 100 µs; task 1 keeps improving from 400 µs.
        let mut s = sched(&[1.0, 1.0]);
        let all = [true; 2];
        s.next(&all);
        s.next(&all);
        for r in 0..5 {
            s.observe(0, Some(100.0), 64);
            s.observe(1, Some(400.0 - 50.0 * r as f64), 64);
        }
        assert_eq!(s.next(&all), Some(1));
        // A task that counts 10 times in the network outweighs it.
        let mut s = sched(&[10.0, 1.0]);
        s.next(&all);
        s.next(&all);
        for r in 0..5 {
            s.observe(0, Some(100.0), 64);
            s.observe(1, Some(400.0 - 50.0 * r as f64), 64);
        }
        assert_eq!(s.next(&all), Some(0));
    }

    #[test]
    fn a_task_without_a_kernel_is_tried_again_and_ineligible_tasks_never() {
        let mut s = sched(&[1.0, 1.0]);
        let all = [true; 2];
        s.next(&all);
        s.next(&all);
        s.observe(0, Some(50.0), 64);
        s.observe(1, None, 64);
        assert_eq!(s.next(&all), Some(1));
        assert_eq!(s.next(&[true, false]), Some(0));
        assert_eq!(s.rounds(0), 2);
    }

    #[test]
    fn a_stalled_task_waits_until_every_task_has_stalled() {
        // Task 0 runs at a fifth of task 1's FLOP rate and stopped improving: its forward
        // gradient stays steep. Task 1 improves by 2% a round.
        let all = [true; 2];
        let rounds = |patience| {
            let mut s = sched(&[1.0, 1.0]).with_patience(patience);
            s.tasks[0].flops = 0.2e9;
            s.next(&all);
            s.next(&all);
            for r in 0..4 {
                s.observe(0, Some(100.0), 64);
                s.observe(1, Some(100.0 - 2.0 * r as f64), 64);
            }
            s
        };
        let mut s = rounds(None);
        assert_eq!(
            s.next(&all),
            Some(0),
            "without patience the stalled task wins"
        );
        let mut s = rounds(Some(128));
        assert!(s.stalled(0) && !s.stalled(1));
        assert_eq!(s.next(&all), Some(1));
        // A 0.5% gain is no improvement; once both have stalled the gradient decides.
        s.observe(1, Some(93.6), 64);
        s.observe(1, Some(93.6), 64);
        assert!(s.stalled(1));
        assert_eq!(s.next(&all), Some(0));
    }

    #[test]
    fn the_log_objective_weighs_relative_gains() {
        // Task 0 (300 µs) gains 30 µs a round, 10%; task 1 (20 µs) gains 4, 20%.
        let all = [true; 2];
        let rounds = |objective| {
            let mut s = sched(&[1.0, 1.0]).with_objective(objective);
            s.tasks[1].flops = 1e9 / 15.0;
            s.next(&all);
            s.next(&all);
            for r in 0..5 {
                s.observe(0, Some(300.0 * 0.9f64.powi(r)), 64);
                s.observe(1, Some(20.0 * 0.8f64.powi(r)), 64);
            }
            s
        };
        assert_eq!(rounds(Objective::Latency).next(&all), Some(0));
        assert_eq!(rounds(Objective::LogLatency).next(&all), Some(1));
    }

    #[test]
    fn the_floor_keeps_every_improving_task_at_half_the_mean_rounds() {
        // Task 0 is a 100 µs task improving 2% a round, task 1 a 1000 µs one improving
        // 3%: the gradient gives task 1 every round, the floor gives task 0 its share.
        let all = [true; 2];
        let run = |floor: f64| {
            let mut s = sched(&[1.0, 1.0])
                .with_floor(floor)
                .with_patience(Some(512));
            let mut best = [100.0, 1000.0];
            for _ in 0..40 {
                let i = s.next(&all).unwrap();
                best[i] *= if i == 0 { 0.98 } else { 0.97 };
                s.observe(i, Some(best[i]), 64);
            }
            (s.rounds(0), s.rounds(1))
        };
        let (small, large) = run(0.0);
        assert!(
            small <= 2,
            "without a floor the small task starves: {small}"
        );
        assert_eq!(small + large, 40);
        let (small, large) = run(DEFAULT_FLOOR);
        // Half the mean of 20 rounds, within the one round the floor waits for.
        assert!((9..=11).contains(&small), "{small} rounds under the floor");
        assert_eq!(small + large, 40);
    }

    #[test]
    fn a_stalled_task_gets_no_floor() {
        let all = [true; 2];
        let mut s = sched(&[1.0, 1.0])
            .with_floor(DEFAULT_FLOOR)
            .with_patience(Some(64));
        s.next(&all);
        s.next(&all);
        // Task 0 stalls at once; task 1 keeps improving.
        s.observe(0, Some(100.0), 64);
        s.observe(0, Some(100.0), 64);
        let mut best = 1000.0;
        for _ in 0..10 {
            assert!(s.stalled(0));
            assert_eq!(s.next(&all), Some(1));
            best *= 0.9;
            s.observe(1, Some(best), 64);
        }
    }

    #[test]
    fn a_resumed_log_replays_into_the_same_stall() {
        let mut s = sched(&[1.0]).with_patience(Some(3));
        s.replay(0, [Some(10.0), None, Some(9.0), Some(8.95), Some(9.5)]);
        assert!(!s.stalled(0), "2 trials since the last 1% gain");
        s.observe(0, Some(8.95), 1);
        assert!(s.stalled(0));
        assert_eq!(s.best(0), 8.95);
    }
}
