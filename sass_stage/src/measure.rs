//! Validating and timing reordered kernels on the GPU, through the tuner's isolated
//! measurement workers and its protocol.
//!
//! The stage-1 cubin is the reference: the worker runs it, then the candidate on the
//! same inputs, and compares every output element exactly (inputs are small integers,
//! so any difference at all is a reordering bug, not rounding), then times the
//! candidate. A candidate that faults or differs is recorded and never emitted. The
//! chosen order is validated again on further input seeds before it is written.

use crate::SassError;
use crate::agents::objective::{Evaluation, Objective, text_hash};
use crate::decode::cubin::{Cubin, KernelText};
use crate::legality::analysis::Kernel;
use crate::legality::order::Order;
use gpu::protocol::{KernelImage, MeasureRequest, Outcome};
use gpu::{Pool, Problem, TimingConfig};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// Timing of stage-2 candidates: longer than the tuner's default, because the gains
/// sought are a few percent.
pub fn default_timing() -> TimingConfig {
    TimingConfig {
        warmup: 5,
        min_time_ms: 60.0,
        min_repeats: 40,
        max_repeats: 10_000,
        race_us: None,
        precision: None,
    }
}

/// One kernel on one GPU: the cubin, its launch and the inputs it is checked on.
pub struct Target<'a> {
    pub cubin: &'a Cubin,
    pub text: &'a KernelText,
    /// The stage-1 cubin on disk (the reference).
    pub reference: KernelImage,
    pub problem: Problem,
    /// Where candidate cubins are written.
    pub workdir: PathBuf,
}

/// A budgeted, cached objective measured through `pool`.
pub struct GpuObjective<'a> {
    pool: &'a mut Pool,
    target: &'a Target<'a>,
    pub timing: TimingConfig,
    pub timeout: Duration,
    budget: usize,
    used: usize,
    /// Exact checks run (each measurement checks once; extra seeds add more).
    pub validations: usize,
    cache: HashMap<String, Evaluation>,
    next_id: u64,
}

impl<'a> GpuObjective<'a> {
    pub fn new(pool: &'a mut Pool, target: &'a Target<'a>, budget: usize) -> GpuObjective<'a> {
        GpuObjective {
            pool,
            target,
            timing: default_timing(),
            timeout: Duration::from_secs(10),
            budget,
            used: 0,
            validations: 0,
            cache: HashMap::new(),
            next_id: 0,
        }
    }

    /// Writes the cubin of `order` and returns its image.
    fn image(&self, kernel: &Kernel, order: &Order) -> Result<KernelImage, SassError> {
        let hash = text_hash(kernel, order);
        let path = self.target.workdir.join(format!("{}.cubin", &hash[..16]));
        if !path.exists() {
            let bytes = self
                .target
                .cubin
                .with_text(self.target.text, &kernel.words(order));
            std::fs::write(&path, bytes)
                .map_err(|e| SassError::Tool(format!("cannot write {}: {e}", path.display())))?;
        }
        Ok(KernelImage {
            cubin: path,
            ..self.target.reference.clone()
        })
    }

    fn run(
        &mut self,
        candidate: KernelImage,
        seed: u64,
        timing: TimingConfig,
    ) -> Result<Evaluation, SassError> {
        let request = MeasureRequest {
            id: self.next_id,
            problem: Problem {
                seed,
                ..self.target.problem.clone()
            },
            reference: self.target.reference.clone(),
            candidate,
            timing,
            injected: None,
        };
        self.next_id += 1;
        self.validations += 1;
        let results = self
            .pool
            .measure_all(&[request], self.timeout, &|_, _, _| {})
            .map_err(|e| SassError::Gpu(e.to_string()))?;
        Ok(match &results[0].0 {
            Outcome::Ok(t) => Evaluation::Time(t.median_us),
            Outcome::Error { kind, message } => Evaluation::Failed(format!("{kind}: {message}")),
        })
    }

    /// Times `order` afresh (no cache, no budget): for the interleaved final comparison.
    pub fn time_fresh(&mut self, kernel: &Kernel, order: &Order) -> Result<Evaluation, SassError> {
        let image = self.image(kernel, order)?;
        self.run(image, self.target.problem.seed, self.timing)
    }

    /// Checks `order` bit for bit on `seeds` further input sets (one run each).
    pub fn validate(
        &mut self,
        kernel: &Kernel,
        order: &Order,
        seeds: &[u64],
    ) -> Result<Result<(), String>, SassError> {
        let image = self.image(kernel, order)?;
        let once = TimingConfig {
            warmup: 0,
            min_time_ms: 0.0,
            min_repeats: 1,
            max_repeats: 1,
            race_us: None,
            precision: None,
        };
        for &seed in seeds {
            if let Evaluation::Failed(why) = self.run(image.clone(), seed, once)? {
                return Ok(Err(format!("input seed {seed}: {why}")));
            }
        }
        Ok(Ok(()))
    }
}

impl Objective for GpuObjective<'_> {
    fn evaluate(&mut self, kernel: &Kernel, order: &Order) -> Result<Evaluation, SassError> {
        let hash = text_hash(kernel, order);
        if let Some(e) = self.cache.get(&hash) {
            return Ok(e.clone());
        }
        let image = self.image(kernel, order)?;
        let e = self.run(image, self.target.problem.seed, self.timing)?;
        self.used += 1;
        self.cache.insert(hash, e.clone());
        Ok(e)
    }

    fn used(&self) -> usize {
        self.used
    }

    fn budget(&self) -> usize {
        self.budget
    }
}
