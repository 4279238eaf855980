//! The tuner's side of the measurement workers: one child process per GPU, fed requests
//! over stdin and read over stdout on a thread, so that every answer can be waited for
//! with a deadline. A worker that dies (a faulting kernel) or misses its deadline (a
//! hung kernel, then killed) is restarted, and the candidate gets `launch` or `timeout`;
//! the tuner itself never sees a CUDA error.

use crate::check::Problem;
use crate::device::DeviceInfo;
use crate::protocol::{ErrorKind, KernelImage, MeasureRequest, Outcome, Phases, Request, Response};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;

/// Lines of a worker's stderr kept for error messages.
const STDERR_LINES: usize = 20;
/// How long a worker may take to create its context and say it is ready.
const STARTUP: Duration = Duration::from_secs(60);
/// Deadline for a worker to fill a task's inputs and run its reference (multi-GB
/// tensors take seconds to generate and copy): separate from, and far longer than, the
/// per-candidate `--timeout`.
const PREPARE: Duration = Duration::from_secs(600);
/// Attempts to start a worker before the pool gives up on its device.
const START_TRIES: u32 = 4;
/// Pause after the first failed start (doubled after each further one).
const FIRST_PAUSE: Duration = Duration::from_millis(250);

#[derive(Debug, Error)]
pub enum PoolError {
    /// No usable GPU (the worker's own one-line reason).
    #[error("{0}")]
    Unavailable(String),
    #[error("cannot start the measurement worker {program}: {error}")]
    Spawn {
        program: String,
        error: std::io::Error,
    },
    #[error("measurement worker for device {device}: {message}")]
    Protocol { device: u32, message: String },
    #[error("the devices differ ({0}): measure on devices of one kind")]
    Mixed(String),
    #[error(
        "the measurement worker for device {device} could not be restarted ({tries} tries): {last}"
    )]
    Restart {
        device: u32,
        tries: u32,
        last: String,
    },
}

/// How to start a worker: the program and its arguments; `--device N` is appended.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// One running worker process.
struct Worker {
    command: WorkerCommand,
    ordinal: u32,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    device: DeviceInfo,
    /// Device memory free when the worker started, when it said.
    free_bytes: Option<u64>,
    /// The problem and reference of the last request: the worker holds buffers and a
    /// reference output for it (and keeps a few earlier ones prepared, answering their
    /// `Prepare` at once).
    prepared: Option<(Problem, KernelImage)>,
    /// How long preparing it took the first time, added to each candidate's deadline: a
    /// candidate's check runs (and, when it differs, reads back) an output of the task's
    /// size, as the reference run in the preparation did, which for a multi-GB task
    /// takes seconds that are the tool's, not the candidate's. Milliseconds for a
    /// layer-sized task.
    check_allowance: Duration,
    /// The first preparation's time of each problem (by key) this process prepared.
    allowances: std::collections::HashMap<String, Duration>,
    /// Time spent preparing a task for the request being measured (its `Phases`).
    prepare_ms: f64,
    progress: Option<ProgressSink>,
}

/// Where a worker's preparation progress goes: the device's ordinal and the message.
pub type ProgressSink = Arc<dyn Fn(u32, &str) + Send + Sync>;

impl Worker {
    fn start(command: &WorkerCommand, ordinal: u32) -> Result<Worker, PoolError> {
        // Its own process group: a Ctrl-C at the terminal reaches the tuner, which
        // decides; the worker's watchdog ends it once the tuner is gone however it went.
        let mut child = Command::new(&command.program)
            .args(&command.args)
            .arg("--device")
            .arg(ordinal.to_string())
            .env(crate::worker::PARENT_ENV, std::process::id().to_string())
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| PoolError::Spawn {
                program: command.program.display().to_string(),
                error,
            })?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr_pipe = child.stderr.take().expect("stderr is piped");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let tail = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
                let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                if tail.len() == STDERR_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let protocol = |message: String| PoolError::Protocol {
            device: ordinal,
            message,
        };
        let first = match lines.recv_timeout(STARTUP) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                std::thread::sleep(Duration::from_millis(50)); // let stderr drain
                let why = match e {
                    RecvTimeoutError::Timeout => "not ready within 60 s".to_string(),
                    RecvTimeoutError::Disconnected => format!("exited ({status})"),
                };
                return Err(protocol(format!("{why}{}", tail_text(&stderr))));
            }
        };
        let (device, free_bytes) = match serde_json::from_str::<Response>(&first) {
            Ok(Response::Ready { device, free_bytes }) => (device, free_bytes),
            Ok(Response::Unavailable { message }) => {
                let _ = child.wait();
                return Err(PoolError::Unavailable(message));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(protocol(format!("unexpected first line {first:?}")));
            }
        };
        Ok(Worker {
            command: command.clone(),
            ordinal,
            child,
            stdin,
            lines,
            stderr,
            device,
            free_bytes,
            prepared: None,
            check_allowance: Duration::ZERO,
            allowances: Default::default(),
            prepare_ms: 0.0,
            progress: None,
        })
    }

    fn stop(&mut self) -> String {
        let _ = self.child.kill();
        self.child
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| e.to_string())
    }

    /// Starts a worker again, retrying a failed start `START_TRIES` times with a
    /// doubling pause (a driver busy tearing down the last context, a transient
    /// refusal).
    fn start_retrying(command: &WorkerCommand, ordinal: u32) -> Result<Worker, PoolError> {
        let mut pause = FIRST_PAUSE;
        let mut attempt = 1;
        loop {
            match Worker::start(command, ordinal) {
                Ok(w) => return Ok(w),
                Err(e) if attempt >= START_TRIES => {
                    return Err(PoolError::Restart {
                        device: ordinal,
                        tries: attempt,
                        last: e.to_string(),
                    });
                }
                Err(_) => {
                    std::thread::sleep(pause);
                    pause *= 2;
                    attempt += 1;
                }
            }
        }
    }

    fn restart(&mut self) -> Result<(), PoolError> {
        self.stop();
        let progress = self.progress.take();
        *self = Worker::start_retrying(&self.command, self.ordinal)?;
        self.progress = progress;
        Ok(())
    }

    /// Readies the worker for `request`'s problem and reference under `PREPARE`'s
    /// deadline (not the candidate's): `Some` outcome for the request when that failed.
    fn prepare(&mut self, request: &MeasureRequest) -> Result<Option<Outcome>, Lost> {
        let key = (request.problem.clone(), request.reference.clone());
        if self.prepared.as_ref() == Some(&key) {
            return Ok(None);
        }
        let lost = |outcome: Option<Outcome>| move |error: PoolError| Lost { outcome, error };
        let line = serde_json::to_string(&Request::Prepare {
            id: request.id,
            problem: key.0.clone(),
            reference: key.1.clone(),
        })
        .expect("requests always serialize");
        if self.send(&line).is_err() {
            self.restart().map_err(lost(None))?;
            return self.prepare(request);
        }
        let environment = |message: String| Outcome::error(ErrorKind::Environment, message);
        let started = std::time::Instant::now();
        let deadline = started + PREPARE;
        let answer = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.lines.recv_timeout(left);
            if let Ok(line) = &line
                && let Ok(Response::Progress { id, message }) = serde_json::from_str(line)
                && id == request.id
            {
                if let Some(progress) = &self.progress {
                    progress(self.ordinal, &message);
                }
                continue;
            }
            break line;
        };
        let failed = match answer {
            Ok(answer) => match serde_json::from_str::<Response>(&answer) {
                Ok(Response::Prepared { id, error, fatal }) if id == request.id => match error {
                    None => {
                        let first = *self
                            .allowances
                            .entry(key.0.key.clone())
                            .or_insert_with(|| started.elapsed());
                        self.prepared = Some(key);
                        self.check_allowance = first;
                        self.prepare_ms += started.elapsed().as_secs_f64() * 1e3;
                        return Ok(None);
                    }
                    Some(e) if fatal => {
                        (environment(format!("reference kernel failed: {e}")), true)
                    }
                    Some(e) => (environment(format!("reference kernel failed: {e}")), false),
                },
                _ => (environment(format!("unexpected answer {answer:?}")), true),
            },
            Err(RecvTimeoutError::Timeout) => (
                environment(format!(
                    "the task's inputs and reference run took over {} s (the deadline for \
                     preparing a task; --timeout applies to each candidate after it): \
                     worker killed and restarted",
                    PREPARE.as_secs()
                )),
                true,
            ),
            Err(RecvTimeoutError::Disconnected) => (
                environment(format!(
                    "the worker died preparing the task's inputs and reference{}",
                    tail_text(&self.stderr)
                )),
                true,
            ),
        };
        let (outcome, restart) = failed;
        if restart {
            self.restart().map_err(lost(Some(outcome.clone())))?;
        }
        Ok(Some(outcome))
    }

    /// Whether the worker process has ended (killed from outside while idle, say).
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    fn send(&mut self, line: &str) -> std::io::Result<()> {
        writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush())
    }

    /// Measures one request, with where its time went; `Err` only when the worker
    /// cannot be restarted.
    fn measure(
        &mut self,
        request: &MeasureRequest,
        timeout: Duration,
    ) -> Result<(Outcome, Phases), Lost> {
        let measured = self.measure_prepared(request, timeout);
        // The task prepared for this request (`prepare`), counted in its phases.
        let prepared = std::mem::take(&mut self.prepare_ms);
        measured.map(|(outcome, mut phases)| {
            phases.prepare_ms += prepared;
            (outcome, phases)
        })
    }

    /// `measure`'s work: the task prepared (as needed), then the candidate measured.
    fn measure_prepared(
        &mut self,
        request: &MeasureRequest,
        timeout: Duration,
    ) -> Result<(Outcome, Phases), Lost> {
        let lost = |outcome: Option<Outcome>| move |error: PoolError| Lost { outcome, error };
        let none = Phases::default();
        // A worker that died while idle is started again before it is given the
        // request: the new process holds no task, so `prepare` readies it under its own
        // deadline rather than the candidate's.
        if self.exited() {
            self.restart().map_err(lost(None))?;
        }
        if let Some(failed) = self.prepare(request)? {
            return Ok((failed, none));
        }
        let line = serde_json::to_string(&Request::Measure(request.clone()))
            .expect("requests always serialize");
        if self.send(&line).is_err() {
            // It died since: once more, prepared again.
            self.restart().map_err(lost(None))?;
            if let Some(failed) = self.prepare(request)? {
                return Ok((failed, none));
            }
            self.send(&line)
                .map_err(|e| PoolError::Protocol {
                    device: self.ordinal,
                    message: format!("cannot send a request: {e}"),
                })
                .map_err(lost(None))?;
        }
        let allowance = self.check_allowance;
        match self.lines.recv_timeout(timeout + allowance) {
            Ok(answer) => match serde_json::from_str::<Response>(&answer) {
                Ok(Response::Result {
                    id,
                    outcome,
                    fatal,
                    phases,
                }) if id == request.id => {
                    if fatal {
                        self.restart().map_err(lost(Some(outcome.clone())))?;
                    }
                    Ok((outcome, phases))
                }
                _ => {
                    let error = PoolError::Protocol {
                        device: self.ordinal,
                        message: format!("unexpected answer {answer:?}"),
                    };
                    let _ = self.restart();
                    Err(Lost {
                        outcome: None,
                        error,
                    })
                }
            },
            Err(RecvTimeoutError::Timeout) => {
                let waited = if allowance >= Duration::from_millis(100) {
                    format!(
                        "{:.1} s (--timeout, and {:.1} s for checking an output of this \
                         task, as long as preparing it took)",
                        (timeout + allowance).as_secs_f64(),
                        allowance.as_secs_f64()
                    )
                } else {
                    format!("{:.1} s", timeout.as_secs_f64())
                };
                let outcome = Outcome::error(
                    ErrorKind::Timeout,
                    format!("no answer within {waited}: worker killed and restarted"),
                );
                self.restart().map_err(lost(Some(outcome.clone())))?;
                Ok((outcome, none))
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = self.child.kill();
                let status = self.child.wait();
                std::thread::sleep(Duration::from_millis(50)); // let stderr drain
                let shown = status
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                let message = format!(
                    "the worker died while measuring ({shown}){}",
                    tail_text(&self.stderr)
                );
                // Killed by a signal that only comes from outside (a kernel's fault
                // makes the worker answer, or exit with a status): not the candidate's.
                let kind = match status.ok().and_then(|s| s.signal()) {
                    Some(libc::SIGKILL | libc::SIGTERM | libc::SIGINT | libc::SIGHUP) => {
                        ErrorKind::Environment
                    }
                    _ => ErrorKind::Launch,
                };
                let outcome = Outcome::error(kind, message);
                self.restart().map_err(lost(Some(outcome.clone())))?;
                Ok((outcome, none))
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tail_text(stderr: &Mutex<VecDeque<String>>) -> String {
    let tail = stderr.lock().unwrap_or_else(|p| p.into_inner());
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {}", tail.iter().cloned().collect::<Vec<_>>().join(" | "))
    }
}

/// One worker per device; a batch is shared out among them.
pub struct Pool {
    workers: Vec<Worker>,
}

impl Pool {
    /// Starts a worker on each of `devices`. All must be the same kind of GPU, so that
    /// their times are comparable.
    pub fn start(command: &WorkerCommand, devices: &[u32]) -> Result<Pool, PoolError> {
        let workers = devices
            .iter()
            .map(|&d| Worker::start(command, d))
            .collect::<Result<Vec<_>, _>>()?;
        let names: Vec<&str> = workers.iter().map(|w| w.device.name.as_str()).collect();
        if names.iter().any(|n| *n != names[0]) {
            return Err(PoolError::Mixed(names.join(", ")));
        }
        Ok(Pool { workers })
    }

    /// The devices, in the order given to `start`.
    pub fn devices(&self) -> Vec<&DeviceInfo> {
        self.workers.iter().map(|w| &w.device).collect()
    }

    /// Per device (in order), the memory free when its worker started, when it said.
    pub fn free_bytes(&self) -> Vec<Option<u64>> {
        self.workers.iter().map(|w| w.free_bytes).collect()
    }

    /// Sends each worker's preparation progress (large tasks only) to `sink`.
    pub fn on_progress(&mut self, sink: ProgressSink) {
        for w in &mut self.workers {
            w.progress = Some(Arc::clone(&sink));
        }
    }

    /// Measures every request (each device takes the next one left); `done` is called
    /// as each finishes, with its index, the device's position and the outcome. Fails
    /// as a whole when a worker cannot be restarted (`measure_batch` keeps what was
    /// measured).
    pub fn measure_all(
        &mut self,
        requests: &[MeasureRequest],
        timeout: Duration,
        done: &(dyn Fn(usize, usize, &Outcome) + Sync),
    ) -> Result<Vec<(Outcome, usize)>, PoolError> {
        let batch = self.measure_batch(requests, timeout, done);
        if let Some(e) = batch.error {
            return Err(e);
        }
        Ok(batch
            .outcomes
            .into_iter()
            .map(|r| r.expect("every request was measured"))
            .collect())
    }

    /// Measures every request like `measure_all`, but when a worker cannot be
    /// restarted, keeps every outcome already in: the request it was on gets an
    /// `environment` outcome (unless its own outcome was known), requests never handed
    /// out stay `None`, and the error says why the batch stopped.
    pub fn measure_batch(
        &mut self,
        requests: &[MeasureRequest],
        timeout: Duration,
        done: &(dyn Fn(usize, usize, &Outcome) + Sync),
    ) -> Batch {
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<(Outcome, usize)>>> = Mutex::new(vec![None; requests.len()]);
        let take = || {
            let i = next.fetch_add(1, Ordering::Relaxed);
            requests.get(i).map(|r| (i, r.clone(), timeout))
        };
        let stop = AtomicBool::new(false);
        let served = self.serve(
            &take,
            &|i, w, outcome, _| {
                done(i, w, &outcome);
                results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some((outcome, w));
            },
            &stop,
        );
        Batch {
            outcomes: results.into_inner().unwrap_or_else(|p| p.into_inner()),
            error: served.error,
            busy: served.busy,
        }
    }

    /// Measures requests as `next` hands them out (each device takes one, with its
    /// timeout, when it is free; `next` may block, and `None` ends that device's loop),
    /// calling `done` with the caller's tag, the device's position, the outcome and the
    /// time it took. No device takes another request once `stop` is set. When a worker
    /// cannot be restarted, its request gets an `environment` outcome (unless its own
    /// outcome was known), `stop` is set, and the error says why it stopped.
    pub fn serve<T: Send>(
        &mut self,
        next: &(dyn Fn() -> Option<(T, MeasureRequest, Duration)> + Sync),
        done: &(dyn Fn(T, usize, Outcome, Took) + Sync),
        stopped: &AtomicBool,
    ) -> Served {
        let errors: Mutex<Vec<PoolError>> = Mutex::new(Vec::new());
        let busy = std::thread::scope(|scope| {
            let threads: Vec<_> = self
                .workers
                .iter_mut()
                .enumerate()
                .map(|(w, worker)| {
                    let errors = &errors;
                    scope.spawn(move || {
                        let mut busy = Duration::ZERO;
                        while !stopped.load(Ordering::Relaxed) {
                            let Some((tag, request, timeout)) = next() else {
                                break;
                            };
                            let started = std::time::Instant::now();
                            let measured = worker.measure(&request, timeout);
                            let took = started.elapsed();
                            busy += took;
                            let (outcome, phases, lost) = match measured {
                                Ok((outcome, phases)) => (outcome, phases, None),
                                Err(Lost { outcome, error }) => {
                                    let outcome = outcome.unwrap_or_else(|| {
                                        Outcome::error(ErrorKind::Environment, error.to_string())
                                    });
                                    (outcome, Phases::default(), Some(error))
                                }
                            };
                            done(tag, w, outcome, Took { wall: took, phases });
                            if let Some(e) = lost {
                                errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                                // Stop handing out work: the caller stops.
                                stopped.store(true, Ordering::Relaxed);
                            }
                        }
                        busy
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("a measuring thread does not panic"))
                .collect()
        });
        Served {
            error: errors.into_inner().unwrap_or_else(|p| p.into_inner()).pop(),
            busy,
        }
    }
}

/// The time one request took its device: all of it, and where the worker's went.
#[derive(Debug, Clone, Copy, Default)]
pub struct Took {
    pub wall: Duration,
    pub phases: Phases,
}

/// How `serve` ended: the error that stopped it, if one did, and per device (by
/// position) the time its worker spent on requests.
pub struct Served {
    pub error: Option<PoolError>,
    pub busy: Vec<Duration>,
}

/// What `measure_batch` measured: an outcome and the device's position per request
/// (`None`: never handed out), and why it stopped early, if it did.
pub struct Batch {
    pub outcomes: Vec<Option<(Outcome, usize)>>,
    pub error: Option<PoolError>,
    /// Per device (by position): the time its worker spent on requests of the batch.
    pub busy: Vec<Duration>,
}

/// A worker that could not be restarted, with the outcome of the request it was
/// measuring when that outcome was known (a hang, a crash) before the restart failed.
struct Lost {
    outcome: Option<Outcome>,
    error: PoolError,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Simulated;
    use schedule::LaunchConfig;

    /// A worker written in sh: ready at once; answers `Prepare`; measures only a
    /// prepared task (else it answers `wrong_answer`, as a candidate timed out by a
    /// slow preparation would fail); ends, idle, after answering its first measurement.
    fn one_shot_worker(dir: &std::path::Path) -> WorkerCommand {
        let ready = serde_json::to_string(&Response::Ready {
            device: Simulated::device(0),
            free_bytes: None,
        })
        .unwrap();
        let answer = |outcome: Outcome| {
            serde_json::to_string(&Response::Result {
                id: 777,
                outcome,
                fatal: false,
                phases: Phases::default(),
            })
            .unwrap()
        };
        let prepared = serde_json::to_string(&Response::Prepared {
            id: 777,
            error: None,
            fatal: false,
        })
        .unwrap();
        let ok = answer(Outcome::Ok(crate::Timing::from_samples(vec![5.0])));
        let unprepared = answer(Outcome::error(ErrorKind::WrongAnswer, "not prepared"));
        let script = format!(
            r#"echo '{ready}'
while read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/^{{"type":"[a-z]*","id":\([0-9]*\).*/\1/p')
  case "$line" in
    '{{"type":"prepare"'*) prepared=1; echo '{prepared}' | sed "s/777/$id/" ;;
    *) if [ -n "$prepared" ]; then echo '{ok}' | sed "s/777/$id/"; exit 0; fi
       echo '{unprepared}' | sed "s/777/$id/" ;;
  esac
done
"#
        );
        let path = dir.join("worker.sh");
        std::fs::write(&path, script).unwrap();
        WorkerCommand {
            program: "sh".into(),
            args: vec![path.display().to_string()],
        }
    }

    fn request(id: u64) -> MeasureRequest {
        let image = KernelImage {
            cubin: "k.cubin".into(),
            name: "k".into(),
            launch: LaunchConfig::linear(1, 32, 0),
        };
        MeasureRequest {
            id,
            problem: Problem {
                key: "t".into(),
                inputs: vec![4, 4],
                output: 4,
                reduction: 2,
                seed: 0,
                dtype: Default::default(),
                out_dtype: Default::default(),
            },
            reference: image.clone(),
            candidate: image,
            timing: Default::default(),
            injected: None,
        }
    }

    #[test]
    fn a_worker_dead_while_idle_is_restarted_and_prepared_before_its_next_request() {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = Pool::start(&one_shot_worker(dir.path()), &[0]).unwrap();
        let timeout = Duration::from_secs(10);
        for id in 0..3 {
            let outcomes = pool
                .measure_all(&[request(id)], timeout, &|_, _, _| {})
                .unwrap();
            assert!(
                matches!(outcomes[0].0, Outcome::Ok(_)),
                "request {id}: {:?}",
                outcomes[0].0
            );
            // The worker has answered and ended: wait until it is gone.
            let worker = &mut pool.workers[0];
            let started = std::time::Instant::now();
            while !worker.exited() {
                assert!(started.elapsed() < Duration::from_secs(10), "never ended");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}
