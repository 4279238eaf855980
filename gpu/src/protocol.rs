//! The measurement worker's wire protocol: one JSON object per line. The worker sends
//! `Ready` (or `Unavailable`) once at start, then one `Result` per `Measure` request, in
//! order. Anything the worker prints for people goes to stderr.

use crate::check::Problem;
use crate::device::DeviceInfo;
use crate::timing::TimingConfig;
use schedule::LaunchConfig;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// A compiled kernel to run: the cubin file, the kernel's name and its launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelImage {
    pub cubin: PathBuf,
    pub name: String,
    pub launch: LaunchConfig,
}

/// How a candidate failed. The names are what tuning records store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The generated source did not compile (or the state was invalid).
    Compile,
    /// Loading or launching failed, or the kernel faulted (the worker is restarted).
    Launch,
    /// The kernel did not finish in time (the worker is killed and restarted).
    Timeout,
    /// The output differs from the reference kernel's.
    WrongAnswer,
    /// Not the candidate's fault: its worker was killed from outside or could not be
    /// restarted, the reference run failed, a cubin could not be written or read.
    /// `tune --resume` measures such candidates again.
    Environment,
}

impl ErrorKind {
    /// The kinds a candidate itself can cause (and fault injection can act out).
    pub const ALL: [ErrorKind; 4] = [
        ErrorKind::Compile,
        ErrorKind::Launch,
        ErrorKind::Timeout,
        ErrorKind::WrongAnswer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Compile => "compile",
            ErrorKind::Launch => "launch",
            ErrorKind::Timeout => "timeout",
            ErrorKind::WrongAnswer => "wrong_answer",
            ErrorKind::Environment => "environment",
        }
    }

    pub fn parse(name: &str) -> Option<ErrorKind> {
        Self::ALL
            .into_iter()
            .chain([ErrorKind::Environment])
            .find(|k| k.name() == name)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The timed runs of a correct kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub median_us: f64,
    /// Every timed run, in order, in microseconds.
    pub samples_us: Vec<f32>,
    /// Stopped after its probe, clearly slower than the task's best (`timing`'s race):
    /// the median of the probe's samples. Left out of the JSON when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub raced: bool,
    /// Stopped before the minimum time, its median known within the tuner's precision
    /// (`timing`'s precision rule). Left out of the JSON when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub precise: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl Timing {
    /// The timing of `samples`, with the median rounded to a thousandth of a µs.
    pub fn from_samples(samples_us: Vec<f32>) -> Timing {
        let median = crate::timing::median(&samples_us);
        Timing {
            median_us: (median * 1e3).round() / 1e3,
            samples_us,
            raced: false,
            precise: false,
        }
    }

    /// `from_samples` for a kernel that lost its race.
    pub fn raced(samples_us: Vec<f32>) -> Timing {
        Timing {
            raced: true,
            ..Timing::from_samples(samples_us)
        }
    }
}

/// Where the time of one measurement went, in milliseconds: what `tune`'s end table
/// breaks its measuring time into. The worker fills in its three stages; the pool adds
/// the preparation of the task when the candidate needed one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases {
    /// The task's buffers and reference run, when the worker held another task.
    #[serde(default)]
    pub prepare_ms: f64,
    /// Reading the cubin and loading its module.
    #[serde(default)]
    pub load_ms: f64,
    /// The exact check: a run on the poisoned output, and the comparison.
    #[serde(default)]
    pub check_ms: f64,
    /// The timed runs, warm-up included.
    #[serde(default)]
    pub time_ms: f64,
}

impl Phases {
    /// The sum of the stages.
    pub fn total_ms(&self) -> f64 {
        self.prepare_ms + self.load_ms + self.check_ms + self.time_ms
    }

    /// Adds `other`'s stages to these.
    pub fn add(&mut self, other: &Phases) {
        self.prepare_ms += other.prepare_ms;
        self.load_ms += other.load_ms;
        self.check_ms += other.check_ms;
        self.time_ms += other.time_ms;
    }
}

/// What measuring one candidate gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok(Timing),
    Error { kind: ErrorKind, message: String },
}

impl Outcome {
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Outcome {
        Outcome::Error {
            kind,
            message: message.into(),
        }
    }
}

/// Measure one candidate: check it against the reference on `problem`, then time it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasureRequest {
    pub id: u64,
    pub problem: Problem,
    pub reference: KernelImage,
    pub candidate: KernelImage,
    pub timing: TimingConfig,
    /// Test hook: the fault deliberately built into this candidate. The CUDA worker runs
    /// the (already broken) kernel as it is; the simulated worker acts the fault out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injected: Option<ErrorKind>,
}

/// Tuner to worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    Measure(MeasureRequest),
    /// Allocate and fill `problem`'s buffers and run `reference` on them, so that the
    /// measurements that follow (same problem and reference) start at once: for a
    /// large task this takes far longer than one candidate may, and gets its own
    /// deadline.
    Prepare {
        id: u64,
        problem: Problem,
        reference: KernelImage,
    },
}

/// Worker to tuner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// The worker holds a context on this device and waits for requests; `free_bytes`:
    /// the device memory free then (absent from workers that predate it).
    Ready {
        device: DeviceInfo,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        free_bytes: Option<u64>,
    },
    /// How the preparation for `Prepare` `id` goes: a stage done, for a task large enough
    /// that preparing it takes a while (see `worker::REPORTED_BYTES`).
    Progress { id: u64, message: String },
    /// There is no usable GPU; the worker exits.
    Unavailable { message: String },
    /// The answer to `Prepare` `id`: `error` when the inputs or the reference failed
    /// (`fatal`: the context is lost and the worker exits).
    Prepared {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(default)]
        fatal: bool,
    },
    /// The answer to request `id`. `fatal`: the context is lost and the worker exits.
    /// `phases`: where the worker's time went (absent from workers that predate it).
    Result {
        id: u64,
        outcome: Outcome,
        #[serde(default)]
        fatal: bool,
        #[serde(default)]
        phases: Phases,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_single_json_lines_that_round_trip() {
        let responses = [
            Response::Unavailable {
                message: "no CUDA driver".into(),
            },
            Response::Result {
                id: 3,
                outcome: Outcome::Ok(Timing {
                    median_us: 12.5,
                    samples_us: vec![12.0, 12.5, 13.0],
                    raced: false,
                    precise: false,
                }),
                fatal: false,
                phases: Phases {
                    load_ms: 1.5,
                    check_ms: 2.0,
                    time_ms: 21.0,
                    ..Phases::default()
                },
            },
            Response::Result {
                id: 4,
                outcome: Outcome::error(ErrorKind::WrongAnswer, "output[1] = NaN\nexpected 2"),
                fatal: true,
                phases: Phases::default(),
            },
        ];
        for r in responses {
            let line = serde_json::to_string(&r).unwrap();
            assert!(!line.contains('\n'));
            assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), r);
        }
        let line = serde_json::to_string(&ErrorKind::WrongAnswer).unwrap();
        assert_eq!(line, "\"wrong_answer\"");
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(k.name()), Some(k));
        }
    }
}
