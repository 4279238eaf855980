//! Fault injection, a developer's hook: deliberately broken candidates that prove the
//! measurement isolation works (a faulting kernel becomes `launch`, a hanging one
//! `timeout`, a wrong one `wrong_answer`, a malformed one `compile`) while the tuning
//! run goes on. Each fault is built into the candidate's CUDA source, so the real
//! worker runs a really broken kernel; the simulated worker is told what was injected.
//! One more, `panic`, panics while the candidate is generated, as a failed assert in a
//! lowering would: its build reports it as a `compile` failure.

use gpu::ErrorKind;
use schedule::{Epilogue, GeneratedKernel, GpuSpec, InvalidState, State, Task, generate};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A fault built into a candidate: a failure of each kind a candidate can cause (and
/// the environment's, which the worker acts out), or a panic while generating it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    Compile,
    Launch,
    Timeout,
    WrongAnswer,
    Environment,
    Panic,
}

impl Fault {
    /// The kind of failure the fault causes, as its record names it.
    pub fn kind(self) -> ErrorKind {
        match self {
            Fault::Compile | Fault::Panic => ErrorKind::Compile,
            Fault::Launch => ErrorKind::Launch,
            Fault::Timeout => ErrorKind::Timeout,
            Fault::WrongAnswer => ErrorKind::WrongAnswer,
            Fault::Environment => ErrorKind::Environment,
        }
    }

    fn parse(name: &str) -> Option<Fault> {
        if name == "panic" {
            return Some(Fault::Panic);
        }
        Some(match ErrorKind::parse(name)? {
            ErrorKind::Compile => Fault::Compile,
            ErrorKind::Launch => Fault::Launch,
            ErrorKind::Timeout => Fault::Timeout,
            ErrorKind::WrongAnswer => Fault::WrongAnswer,
            ErrorKind::Environment => Fault::Environment,
        })
    }
}

/// A fault specification that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    #[error("fault '{0}' is not KIND@TRIAL")]
    Syntax(String),
    #[error("unknown fault kind '{0}' (expected compile, launch, timeout, wrong_answer or panic)")]
    Kind(String),
    #[error("fault trial '{0}' is not a number")]
    Trial(String),
}

/// Parses `KIND@TRIAL[,KIND@TRIAL...]`, where TRIAL counts candidates from 0 in the
/// order this run builds them and KIND is compile, launch, timeout, wrong_answer or panic.
pub fn parse(spec: &str) -> Result<BTreeMap<usize, Fault>, InjectError> {
    let mut out = BTreeMap::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (kind, trial) = item
            .split_once('@')
            .ok_or_else(|| InjectError::Syntax(item.to_string()))?;
        let kind = Fault::parse(kind).ok_or_else(|| InjectError::Kind(kind.to_string()))?;
        let trial = trial
            .parse()
            .map_err(|_| InjectError::Trial(trial.to_string()))?;
        out.insert(trial, kind);
    }
    Ok(out)
}

/// Inserts `line` as the first statement of the kernel body.
fn prepend_to_body(source: &str, line: &str) -> String {
    let mut out = String::new();
    let mut done = false;
    for l in source.lines() {
        out.push_str(l);
        out.push('\n');
        if !done && l.contains("__global__") && l.trim_end().ends_with('{') {
            out.push_str(line);
            out.push('\n');
            done = true;
        }
    }
    assert!(done, "a generated kernel has a __global__ signature line");
    out
}

/// The kernel of `state` with `fault` built in.
pub fn faulty_kernel(
    fault: Fault,
    task: &Task,
    state: &State,
    gpu: &GpuSpec,
) -> Result<GeneratedKernel, InvalidState> {
    let kind = match fault {
        Fault::Panic => panic!("injected fault: an assert of the lowering failed"),
        fault => fault.kind(),
    };
    if kind == ErrorKind::WrongAnswer && state.split_k == 1 {
        // A plausible bug: the epilogue's ReLU dropped (or added). Inputs of both signs
        // make outputs of both signs, so the answer differs. (A split-K state cannot
        // take a ReLU: see below.)
        let flipped = Task {
            epilogue: Epilogue {
                relu: !task.epilogue.relu,
                ..task.epilogue
            },
            ..*task
        };
        let mut kernel = generate(&flipped, state, gpu)?;
        // Keep the name of the task's kernel.
        kernel.source = kernel.source.replace(&flipped.key(), &task.key());
        kernel.name = task.key();
        return Ok(kernel);
    }
    let mut kernel = generate(task, state, gpu)?;
    let line = match kind {
        // Not a fault of the kernel: the worker acts it out (it is killed).
        ErrorKind::Environment => return Ok(kernel),
        // 2^40 floats past the output: unmapped on any GPU.
        ErrorKind::Launch => {
            "  if (threadIdx.x == 0) { *reinterpret_cast<volatile float*>(out + (1ll << 40)) = 1.0f; } // injected fault"
        }
        ErrorKind::Timeout => "  for (;;) { __nanosleep(1000); } // injected hang",
        ErrorKind::Compile => "  injected_compile_error; // injected",
        // Split-K kernels add into the zeroed output: one more addition is a wrong sum.
        ErrorKind::WrongAnswer => {
            "  if (blockIdx.x == 0 && threadIdx.x == 0) { atomicAdd(out, 1.0f); } // injected wrong answer"
        }
    };
    kernel.source = prepend_to_body(&kernel.source, line);
    Ok(kernel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use schedule::{Sampler, parse_shape};

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let m = parse("launch@3, timeout@7,wrong_answer@12,panic@13").unwrap();
        assert_eq!(m[&3], Fault::Launch);
        assert_eq!(m[&7], Fault::Timeout);
        assert_eq!(m[&12], Fault::WrongAnswer);
        assert_eq!(m[&13], Fault::Panic);
        assert_eq!(m[&13].kind(), ErrorKind::Compile, "a panic's build fails");
        assert!(
            parse("crash@1")
                .unwrap_err()
                .to_string()
                .contains("unknown fault kind")
        );
        assert!(
            parse("launch")
                .unwrap_err()
                .to_string()
                .contains("KIND@TRIAL")
        );
        assert!(
            parse("launch@x")
                .unwrap_err()
                .to_string()
                .contains("not a number")
        );
    }

    #[test]
    fn faults_change_the_kernel_but_not_its_name_or_launch() {
        let task = Task::new(
            parse_shape("matmul", "64,64,64").unwrap(),
            Default::default(),
        )
        .unwrap();
        let gpu = GpuSpec::h100();
        let state = Sampler::new(&task, &gpu, 1).sample().unwrap();
        let clean = generate(&task, &state, &gpu).unwrap();
        for fault in [
            Fault::Compile,
            Fault::Launch,
            Fault::Timeout,
            Fault::WrongAnswer,
        ] {
            let k = faulty_kernel(fault, &task, &state, &gpu).unwrap();
            assert_eq!(
                (&k.name, &k.launch),
                (&clean.name, &clean.launch),
                "{fault:?}"
            );
            assert_ne!(k.source, clean.source, "{fault:?}");
        }
        let panicked =
            std::panic::catch_unwind(|| faulty_kernel(Fault::Panic, &task, &state, &gpu));
        assert!(panicked.is_err(), "a panic fault panics");
        let plain = State {
            split_k: 1,
            ..state.clone()
        };
        let wrong = faulty_kernel(Fault::WrongAnswer, &task, &plain, &gpu).unwrap();
        assert!(
            wrong.source.contains("fmaxf"),
            "the wrong kernel adds a ReLU"
        );
        // A split-K kernel cannot take a ReLU: it adds once more instead.
        let mut sampler = Sampler::new(&task, &gpu, 2);
        let multi_stage = (0..500)
            .filter_map(|_| sampler.sample())
            .find(|s| s.stages(&task.contraction()) >= 2)
            .unwrap();
        let split = State {
            split_k: 2,
            ..multi_stage
        };
        let clean = generate(&task, &split, &gpu).unwrap();
        let wrong = faulty_kernel(Fault::WrongAnswer, &task, &split, &gpu).unwrap();
        assert_eq!(wrong.launch, clean.launch);
        assert!(wrong.source.contains("atomicAdd(out, 1.0f)"));
    }
}
