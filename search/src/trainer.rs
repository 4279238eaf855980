//! Retrains the cost model on a thread of its own, so that proposing the next round
//! does not wait for training on the last one.
//!
//! Which model a round is planned with must not depend on how fast training happens to
//! be, or the candidates drawn would change from run to run. So each retraining is
//! tagged with the number of rounds finished when it was asked for, and a round is
//! planned with every retraining tagged up to a fixed count (`Trainer::catch_up`),
//! waiting for it if it is still running. With a lag of one round (`--model-lag 1`), the
//! retraining on the round that just finished runs while the next round is proposed,
//! instead of before it, at the price of a model one round older (for many GPUs, whose
//! rounds go by faster than a retraining); by default the tuner waits for the freshest.
//!
//! Retraining after every round costs time: 1.3-1.5 s on a Hopper host (200 boosting
//! rounds on the shipped model's 8213 rows and the run's), while racing brought a round
//! of 64 candidates down to about 2 s on one GPU and 0.3 s on four, where the tuner spent
//! 31 of a 37.6 s run waiting for retrainings (`benchmarks/results/h200-2026-11-28/scale/`).
//! A `RetrainSchedule` with a `growth` above 0 retrains only once the rows learnt since
//! the last retraining reach that share of those learnt up to it, so retrainings grow
//! geometrically apart. It counts rows, not seconds, so the candidates drawn still do
//! not depend on how fast anything ran. It costs ranking quality, though: replayed
//! round by round (`tilesched model replay`), the model's pairwise accuracy on the next
//! round fell from 0.711 to 0.681 at growth 0.1 on the issue-29 GEMM set's 240 s log
//! (110 retrainings down to 31), and from 0.757 to 0.730 on resnet fp16 batch 1's 120 s
//! log. So `tune` retrains after every round unless told otherwise, and makes that cheap
//! instead: by default most retrainings are residual ones (`costmodel::xgb`), 3-5x
//! cheaper, which on four H200s cut the same run from 34.9 to 20.2 s.

use costmodel::{CostModel, Dataset, Fit, Fitted, ModelError};
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

type Trained = (Result<Fitted, ModelError>, Duration);

/// When a retraining is due, by the rows the run has learnt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrainSchedule {
    /// A retraining is due once the rows learnt since the last one are at least this
    /// share of the rows learnt up to it; 0 retrains after every batch (Ansor's way).
    pub growth: f64,
}

impl RetrainSchedule {
    /// After every batch.
    pub const EVERY_BATCH: RetrainSchedule = RetrainSchedule { growth: 0.0 };

    /// Whether `learnt` rows call for a retraining when the last one was on `trained_on`
    /// of them (0: none yet, so the first batch does).
    pub fn due(&self, learnt: usize, trained_on: usize) -> bool {
        let new = learnt.saturating_sub(trained_on);
        new > 0 && (trained_on == 0 || new as f64 >= self.growth * trained_on as f64)
    }
}

/// Test hook: milliseconds added to every retraining, so that tests can show that
/// slow training changes no candidate.
pub const SIMULATED_TRAIN_ENV: &str = "TILESCHED_SIMULATED_TRAIN_MS";

pub(crate) struct Trainer<'scope> {
    fits: Option<Sender<Fit>>,
    trained: Receiver<Trained>,
    thread: Option<ScopedJoinHandle<'scope, ()>>,
    /// Tags of the retrainings asked for and not yet installed, oldest first.
    pending: VecDeque<usize>,
    /// Time the training thread spent training.
    pub(crate) training: Duration,
    /// Retrainings installed.
    pub(crate) installed: usize,
    schedule: RetrainSchedule,
    /// Rows given to `learn`, and of them those the last retraining started on.
    learnt: usize,
    trained_on: usize,
}

impl<'scope> Trainer<'scope> {
    pub(crate) fn spawn<'env>(
        scope: &'scope Scope<'scope, 'env>,
        schedule: RetrainSchedule,
    ) -> Self {
        let (fits, jobs) = channel::<Fit>();
        let (done, trained) = channel::<Trained>();
        let delay = std::env::var(SIMULATED_TRAIN_ENV)
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis);
        let thread = scope.spawn(move || {
            for fit in jobs {
                let started = Instant::now();
                if let Some(delay) = delay {
                    std::thread::sleep(delay);
                }
                let fitted = fit.run();
                if done.send((fitted, started.elapsed())).is_err() {
                    return;
                }
            }
        });
        Trainer {
            fits: Some(fits),
            trained,
            thread: Some(thread),
            pending: VecDeque::new(),
            training: Duration::ZERO,
            installed: 0,
            schedule,
            learnt: 0,
            trained_on: 0,
        }
    }

    /// Adds `rows` to the model and starts the retraining they call for, if the
    /// schedule says one is due, tagged `tag`.
    pub(crate) fn learn(&mut self, model: &mut dyn CostModel, rows: &Dataset, tag: usize) {
        self.learnt += rows.len();
        let Some(fit) = model.learn(rows) else {
            return;
        };
        if !self.schedule.due(self.learnt, self.trained_on) {
            return;
        }
        self.trained_on = self.learnt;
        // Should the thread have died, `catch_up` finds its answer missing and says so.
        if let Some(fits) = &self.fits {
            let _ = fits.send(fit);
        }
        self.pending.push_back(tag);
    }

    /// Installs every retraining tagged `through` or lower, in order, waiting for those
    /// still running; returns the time waited.
    pub(crate) fn catch_up(
        &mut self,
        model: &mut dyn CostModel,
        through: usize,
    ) -> Result<Duration, ModelError> {
        let started = Instant::now();
        while self.pending.front().is_some_and(|&tag| tag <= through) {
            self.pending.pop_front();
            let Ok((fitted, took)) = self.trained.recv() else {
                return Err(ModelError::Xgboost(
                    "the training thread ended unexpectedly".to_string(),
                ));
            };
            self.training += took;
            model.install(fitted?);
            self.installed += 1;
        }
        Ok(started.elapsed())
    }

    /// Installs every retraining asked for and ends the training thread; returns the
    /// time waited.
    pub(crate) fn finish(&mut self, model: &mut dyn CostModel) -> Result<Duration, ModelError> {
        let waited = self.catch_up(model, usize::MAX)?;
        self.stop();
        Ok(waited)
    }

    fn stop(&mut self) {
        self.fits = None;
        if let Some(thread) = self.thread.take() {
            // A panic in training has already shown as `catch_up`'s missing answer.
            let _ = thread.join();
        }
    }
}

impl Drop for Trainer<'_> {
    /// Ends the training thread when the tuner stops early, once it has run the
    /// retrainings already asked for (their results are dropped).
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use costmodel::{XgbModel, XgbParams};

    fn rows(n: usize, offset: usize) -> Dataset {
        let mut d = Dataset::new(2);
        for i in offset..offset + n {
            let x = (i % 9) as f32;
            d.push(&[x, (i % 4) as f32], "t", Some(5.0 + f64::from(x)));
        }
        d
    }

    fn model() -> XgbModel {
        let params = XgbParams {
            rounds: 20,
            ..XgbParams::default()
        };
        XgbModel::new(vec!["x".into(), "y".into()], params, 3)
    }

    #[test]
    fn a_round_sees_exactly_the_retrainings_up_to_its_tag() {
        let probe = [1.0, 0.0, 8.0, 3.0];
        // The same rows learnt at once, as the reference.
        let mut reference = model();
        reference.update(&rows(150, 0)).unwrap();
        let after_first = reference.predict(&probe);
        reference.update(&rows(150, 150)).unwrap();
        let after_second = reference.predict(&probe);

        let mut m = model();
        std::thread::scope(|scope| {
            let mut trainer = Trainer::spawn(scope, RetrainSchedule::EVERY_BATCH);
            trainer.learn(&mut m, &rows(150, 0), 1);
            trainer.learn(&mut m, &rows(150, 150), 2);
            trainer.catch_up(&mut m, 0).unwrap();
            assert_eq!(trainer.installed, 0);
            trainer.catch_up(&mut m, 1).unwrap();
            assert_eq!(m.predict(&probe), after_first, "only the first retraining");
            trainer.finish(&mut m).unwrap();
            assert_eq!(m.predict(&probe), after_second);
        });
    }

    #[test]
    fn the_schedule_spaces_retrainings_geometrically() {
        let count = |growth: f64| {
            let schedule = RetrainSchedule { growth };
            let mut trained_on = 0;
            (1..=24)
                .map(|round| round * 64)
                .filter(|&learnt| {
                    let due = schedule.due(learnt, trained_on);
                    if due {
                        trained_on = learnt;
                    }
                    due
                })
                .count()
        };
        assert_eq!(count(0.0), 24, "every round");
        assert_eq!(count(0.25), 11);
        assert_eq!(count(0.5), 7);
        assert_eq!(count(1.0), 5, "64, 128, 256, 512, 1024 rows");
        let every = RetrainSchedule::EVERY_BATCH;
        assert!(
            every.due(64, 0) && !every.due(64, 64),
            "nothing new, nothing to learn"
        );
    }

    #[test]
    fn a_batch_the_schedule_skips_is_learnt_by_the_next_retraining() {
        let probe = [1.0, 0.0, 8.0, 3.0];
        let mut reference = model();
        reference.update(&rows(450, 0)).unwrap();
        let mut m = model();
        std::thread::scope(|scope| {
            let mut trainer = Trainer::spawn(scope, RetrainSchedule { growth: 1.0 });
            trainer.learn(&mut m, &rows(150, 0), 1);
            trainer.learn(&mut m, &rows(150, 150), 2);
            assert_eq!(trainer.pending, [1, 2], "150 new rows on 150: due");
            trainer.learn(&mut m, &rows(150, 300), 3);
            assert_eq!(trainer.pending, [1, 2], "150 new rows on 300: not yet");
            trainer.learn(&mut m, &rows(150, 450), 4);
            assert_eq!(trainer.pending, [1, 2, 4], "300 new rows on 300");
            trainer.finish(&mut m).unwrap();
        });
        assert_eq!(m.training_rows(), 600);
        // The last retraining saw every row, the skipped batch's included.
        reference.update(&rows(150, 450)).unwrap();
        assert_eq!(m.predict(&probe), reference.predict(&probe));
    }

    #[test]
    fn too_few_rows_start_no_retraining_and_dropping_ends_the_thread() {
        let mut m = model();
        std::thread::scope(|scope| {
            let mut trainer = Trainer::spawn(scope, RetrainSchedule::EVERY_BATCH);
            trainer.learn(&mut m, &rows(50, 0), 1);
            assert!(trainer.pending.is_empty());
            trainer.learn(&mut m, &rows(100, 50), 2);
            assert_eq!(trainer.pending.len(), 1);
            // Dropped with a retraining in flight: the scope still ends.
        });
    }
}
