//! The assembly game over a measured objective: a step applies one legal move and
//! measures the new order; the reward is `(T_prev − T_new) / T_0 × 100`, a failed
//! candidate gives −1 and ends the episode, episodes last 32 moves (CuAsmRL). Every
//! measurement teaches the edit model; once it is trained, a step it predicts to lose
//! is not measured and its reward is the predicted change (the model as a filter and a
//! shaped reward).

use crate::SassError;
use crate::agents::embed::{COLUMNS, observation};
use crate::agents::game::{Game, Step};
use crate::agents::model::Guide;
use crate::agents::objective::{Evaluation, Objective};
use crate::legality::analysis::Kernel;
use crate::legality::moves::Action;
use crate::legality::order::Order;

pub const EPISODE: usize = 32;

pub struct MeasuredGame<'k, 'o, 'g> {
    kernel: &'k Kernel,
    objective: &'o mut dyn Objective,
    guide: &'o mut Guide<'g>,
    order: Order,
    t0: f64,
    t_prev: f64,
    steps: usize,
}

impl<'k, 'o, 'g> MeasuredGame<'k, 'o, 'g> {
    pub fn new(
        kernel: &'k Kernel,
        objective: &'o mut dyn Objective,
        t0: f64,
        guide: &'o mut Guide<'g>,
    ) -> Self {
        MeasuredGame {
            kernel,
            objective,
            guide,
            order: Order::identity(kernel.len()),
            t0,
            t_prev: t0,
            steps: 0,
        }
    }
}

impl Game for MeasuredGame<'_, '_, '_> {
    fn rows(&self) -> usize {
        self.kernel.len()
    }

    fn columns(&self) -> usize {
        COLUMNS
    }

    fn observation(&self) -> Vec<f32> {
        observation(self.kernel, &self.order)
    }

    fn legal(&self) -> Vec<bool> {
        self.kernel.legal_mask(&self.order)
    }

    fn step(&mut self, action: Action) -> Result<Step, SassError> {
        if !self.kernel.legal(&self.order, action) {
            return Err(SassError::Input(format!("illegal action {action:?}")));
        }
        let before = self.guide.predict(self.kernel, &self.order);
        self.kernel.apply(&mut self.order, action);
        self.steps += 1;
        let predicted = self.guide.predict(self.kernel, &self.order);
        if self.guide.skip(predicted, before) {
            let reward = ((predicted - before) * 100.0) as f32;
            let done = self.steps >= EPISODE || self.objective.exhausted();
            return Ok(Step { reward, done });
        }
        let used = self.objective.used();
        let evaluation = self.objective.evaluate(self.kernel, &self.order)?;
        if self.objective.used() > used {
            self.guide.observe(self.kernel, &self.order, &evaluation);
        }
        let (reward, failed) = match evaluation {
            Evaluation::Time(t) => {
                let r = (self.t_prev - t) / self.t0 * 100.0;
                self.t_prev = t;
                (r as f32, false)
            }
            Evaluation::Failed(_) => (-1.0, true),
        };
        let done = failed || self.steps >= EPISODE || self.objective.exhausted();
        Ok(Step { reward, done })
    }

    fn reset(&mut self) {
        self.order = Order::identity(self.kernel.len());
        self.t_prev = self.t0;
        self.steps = 0;
    }

    fn exhausted(&self) -> bool {
        self.objective.exhausted()
    }
}
