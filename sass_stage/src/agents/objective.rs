//! What the agents optimise: the measured time of an instruction order.
//!
//! The GPU implementation (`measure.rs`) validates and times each new order; tests use
//! synthetic ones. Orders are identified by the hash of the text they produce, so a
//! revisited order costs nothing and the budget counts distinct measurements only.

use crate::SassError;
use crate::legality::analysis::Kernel;
use crate::legality::order::Order;
use sha2::{Digest, Sha256};

/// What evaluating an order gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Evaluation {
    /// Validated bit for bit and timed: median µs.
    Time(f64),
    /// Faulted or produced different output: never emitted, recorded.
    Failed(String),
}

impl Evaluation {
    pub fn time(&self) -> Option<f64> {
        match self {
            Evaluation::Time(t) => Some(*t),
            Evaluation::Failed(_) => None,
        }
    }
}

/// A measured objective with a budget of distinct measurements.
pub trait Objective {
    /// Evaluates `order` of `kernel` (cached orders do not count against the budget).
    fn evaluate(&mut self, kernel: &Kernel, order: &Order) -> Result<Evaluation, SassError>;
    /// Distinct measurements made so far.
    fn used(&self) -> usize;
    /// Measurements allowed in all.
    fn budget(&self) -> usize;
    fn exhausted(&self) -> bool {
        self.used() >= self.budget()
    }
}

/// SHA-256 of the kernel text an order produces (the cache key of its measurement).
pub fn text_hash(kernel: &Kernel, order: &Order) -> String {
    let mut h = Sha256::new();
    for (lo, hi) in kernel.words(order) {
        h.update(lo.to_le_bytes());
        h.update(hi.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Wraps an objective to remember the best order, the best-so-far curve and the
/// failed candidates, whichever agent drives it.
pub struct Tracker<'o> {
    inner: &'o mut dyn Objective,
    pub baseline_us: f64,
    pub best: Order,
    pub best_us: f64,
    /// Best time after each distinct measurement.
    pub curve: Vec<f64>,
    pub failures: Vec<String>,
}

impl<'o> Tracker<'o> {
    /// Measures the original order first (it is the baseline every reward refers to).
    pub fn start(inner: &'o mut dyn Objective, kernel: &Kernel) -> Result<Tracker<'o>, SassError> {
        let identity = Order::identity(kernel.len());
        let baseline_us = match inner.evaluate(kernel, &identity)? {
            Evaluation::Time(t) => t,
            Evaluation::Failed(why) => {
                return Err(SassError::Gpu(format!(
                    "the stage-1 kernel itself failed its check: {why}"
                )));
            }
        };
        Ok(Tracker {
            inner,
            baseline_us,
            best: identity,
            best_us: baseline_us,
            curve: vec![baseline_us],
            failures: Vec::new(),
        })
    }
}

impl Objective for Tracker<'_> {
    fn evaluate(&mut self, kernel: &Kernel, order: &Order) -> Result<Evaluation, SassError> {
        let before = self.inner.used();
        let e = self.inner.evaluate(kernel, order)?;
        let fresh = self.inner.used() > before;
        match &e {
            Evaluation::Time(t) if *t < self.best_us => {
                self.best_us = *t;
                self.best = order.clone();
            }
            Evaluation::Failed(why) if fresh => self.failures.push(why.clone()),
            _ => {}
        }
        if fresh {
            self.curve.push(self.best_us);
        }
        Ok(e)
    }

    fn used(&self) -> usize {
        self.inner.used()
    }

    fn budget(&self) -> usize {
        self.inner.budget()
    }
}
