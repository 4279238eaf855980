//! `tune --queue` and `worker --queue` end to end without a GPU: a real `redis-server`
//! on a loopback port (installed by `scripts/setup.sh` from Debian's package), worker
//! processes with simulated GPUs that build real kernels with NVRTC, and the tuner.
//! Workers are killed mid-job and stopped so that they never acknowledge: no
//! measurement is lost or recorded twice, and a job that outlives two workers is an
//! `environment` failure.

mod common;

use common::records;
use redis::streams::StreamPendingCountReply;
use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of its own, on a free loopback port, without persistence.
struct Server {
    child: Child,
    port: u16,
    password: Option<String>,
}

impl Server {
    /// None (and a note) when no `redis-server` is installed.
    fn start() -> Option<Server> {
        Server::start_with(&[])
    }

    /// With extra `redis-server` options (e.g. `--requirepass`).
    fn start_with(options: &[&str]) -> Option<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = match Server::spawn(port, options) {
            Ok(child) => child,
            Err(e) => {
                eprintln!(
                    "SKIPPED: no redis-server ({e}); scripts/setup.sh installs Debian's redis-server"
                );
                return None;
            }
        };
        let server = Server {
            child,
            port,
            password: options
                .iter()
                .position(|&o| o == "--requirepass")
                .map(|i| options[i + 1].to_string()),
        };
        let started = Instant::now();
        while server.connection().is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }

    fn spawn(port: u16, options: &[&str]) -> std::io::Result<Child> {
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(options)
            .stdout(Stdio::null())
            .spawn()
    }

    /// Kills the server (-9) and starts a new one on the same port, empty: a restart
    /// that loses every stream, group and key.
    fn restart(&mut self, down: Duration) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        std::thread::sleep(down);
        self.child = Server::spawn(self.port, &[]).unwrap();
        let started = Instant::now();
        while self.connection().is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not restart"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn queue(&self, name: &str) -> String {
        format!("redis://127.0.0.1:{}/{name}", self.port)
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let auth = self
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        let mut con = redis::Client::open(format!("redis://{auth}127.0.0.1:{}/", self.port))?
            .get_connection()?;
        let _: String = redis::cmd("PING").query(&mut con)?;
        Ok(con)
    }

    /// How many jobs of queue `name` worker `worker` holds unacknowledged.
    fn held(&self, name: &str, worker: &str) -> usize {
        let mut con = self.connection().unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("tilesched:{name}:jobs:*"))
            .query(&mut con)
            .unwrap();
        keys.iter()
            .map(|k| {
                let pending: StreamPendingCountReply = redis::cmd("XPENDING")
                    .arg(k)
                    .arg("workers")
                    .arg("-")
                    .arg("+")
                    .arg(1000)
                    .arg(worker)
                    .query(&mut con)
                    .unwrap();
                pending.ids.len()
            })
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A worker host's process, killed when dropped (also when a test fails).
struct Worker(Child);

impl Worker {
    /// SIGKILL: nothing of it runs after.
    fn kill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker host with a simulated GPU taking `measure_ms` per candidate.
fn worker(queue: &str, name: &str, measure_ms: u64, cache: &Path) -> Worker {
    Worker(
        worker_command(queue, name, measure_ms, cache, 1)
            .spawn()
            .unwrap(),
    )
}

fn worker_command(queue: &str, name: &str, measure_ms: u64, cache: &Path, lease: u32) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tilesched"));
    c.args(["worker", "--queue", queue, "--simulate", "--name", name])
        .args(["--lease", &lease.to_string()])
        .args(["--cubin-cache", cache.to_str().unwrap()])
        .env(gpu::worker::SIMULATED_MEASURE_ENV, measure_ms.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// A tuner's process, killed when dropped unfinished (a failing test leaves none behind).
struct Tuner(Option<Child>);

impl Tuner {
    fn spawn(mut command: Command) -> Tuner {
        Tuner(Some(command.spawn().unwrap()))
    }

    fn id(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// Waits for it to end.
    fn output(mut self) -> Output {
        self.0.take().expect("running").wait_with_output().unwrap()
    }
}

impl Drop for Tuner {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The tuner on `queue`, in the background.
fn tuner(queue: &str, log: &Path, trials: usize, extra: &[&str]) -> Tuner {
    Tuner::spawn(tuner_command(queue, log, trials, extra))
}

fn tuner_command(queue: &str, log: &Path, trials: usize, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tilesched"));
    c.args([
        "tune", "matmul", "--shape", "96,80,64", "--search", "random",
    ])
    .args(["--trials", &trials.to_string(), "--measure-batch", "4"])
    .args(["--queue", queue, "--queue-wait", "20", "--log"])
    .arg(log)
    .args(extra)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

fn finish(tune: Tuner) -> String {
    let o = tune.output();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    out
}

/// Waits (up to 30 s) until `what` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(30), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(worker: &Worker, name: &str) {
    let pid = worker.0.id().to_string();
    assert!(
        Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap()
            .success()
    );
}

/// Every candidate measured once, correctly.
fn assert_complete(log: &Path, trials: usize) {
    let kept = records(log);
    assert_eq!(kept.len(), trials);
    let states: HashSet<String> = kept.iter().map(|r| r["state"].to_string()).collect();
    assert_eq!(states.len(), trials, "a state recorded twice");
    for r in &kept {
        assert!(r["result"]["ok"].is_object(), "{r}");
    }
}

#[test]
fn a_worker_killed_mid_job_loses_no_measurement_and_duplicates_none() {
    let Some(server) = Server::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    let queue = server.queue("killed");
    let mut a = worker(&queue, "a", 200, &cache);
    let _b = worker(&queue, "b", 200, &cache);
    let log = tmp.path().join("killed.jsonl");
    let tune = tuner(&queue, &log, 32, &[]);
    // Kill A (SIGKILL: nothing of it runs after) while it holds jobs and some are in.
    wait_until("worker a holds jobs after a round is in", || {
        records(&log).len() >= 4 && server.held("killed", "a") > 0
    });
    a.kill();
    let out = finish(tune);
    assert_complete(&log, 32);
    // B took over A's jobs once their lease ran out, and both devices are in the table.
    assert!(out.contains("b GPU 0") && out.contains("a GPU 0"), "{out}");
}

#[test]
fn a_worker_that_never_acknowledges_loses_its_jobs_and_its_late_answers_are_ignored() {
    let Some(server) = Server::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    let queue = server.queue("stopped");
    let a = worker(&queue, "a", 200, &cache);
    let _b = worker(&queue, "b", 200, &cache);
    let log = tmp.path().join("stopped.jsonl");
    let tune = tuner(&queue, &log, 32, &[]);
    // SIGSTOP: A keeps its connection and its jobs but neither answers nor renews.
    wait_until("worker a holds jobs", || server.held("stopped", "a") > 0);
    signal(&a, "-STOP");
    // B takes A's jobs over once their lease ran out; then A goes on and answers too.
    wait_until("worker b took over a's jobs", || {
        server.held("stopped", "a") == 0
    });
    signal(&a, "-CONT");
    let out = finish(tune);
    assert_complete(&log, 32);
    assert!(out.contains("b GPU 0"), "{out}");
}

#[test]
fn a_worker_stopped_by_a_signal_hands_back_its_jobs_at_once_and_leaves_the_queue() {
    let Some(server) = Server::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    let queue = server.queue("graceful");
    // Leases of ten minutes: the run can only finish in time if A's jobs come back at
    // once, not when their lease runs out.
    let a = worker_command(&queue, "a", 200, &cache, 600)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _b = Worker(
        worker_command(&queue, "b", 200, &cache, 600)
            .spawn()
            .unwrap(),
    );
    let log = tmp.path().join("graceful.jsonl");
    let tune = tuner(&queue, &log, 32, &[]);
    wait_until("worker a holds jobs after a round is in", || {
        records(&log).len() >= 4 && server.held("graceful", "a") > 1
    });
    let signalled = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &a.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let stopped = a.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&stopped.stderr);
    assert!(stopped.status.success(), "{:?} {said}", stopped.status);
    assert!(
        said.contains("stopping: answering the jobs being measured"),
        "{said}"
    );
    assert!(said.contains("worker a: handed back"), "{said}");
    assert!(!said.contains("lost Redis"), "{said}");
    // B takes them over at once: their idle time is already the lease.
    wait_until("worker b took over a's jobs", || {
        server.held("graceful", "a") == 0
    });
    let registered: bool = redis::cmd("HEXISTS")
        .arg("tilesched:graceful:workers")
        .arg("a")
        .query(&mut server.connection().unwrap())
        .unwrap();
    assert!(!registered, "a stopped worker stays registered");
    let out = finish(tune);
    assert!(signalled.elapsed() < Duration::from_secs(60));
    assert_complete(&log, 32);
    assert!(out.contains("b GPU 0"), "{out}");
}

#[test]
fn a_job_that_outlives_two_workers_is_an_environment_failure() {
    let Some(server) = Server::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    let queue = server.queue("twice");
    let log = tmp.path().join("twice.jsonl");
    // The candidate takes its simulated GPU a minute: each worker dies holding it.
    let mut a = worker(&queue, "a", 60_000, &cache);
    let tune = tuner(&queue, &log, 1, &["--timeout", "120"]);
    wait_until("worker a holds the job", || server.held("twice", "a") == 1);
    a.kill();
    let mut b = worker(&queue, "b", 60_000, &cache);
    wait_until("worker b took the job over", || {
        server.held("twice", "b") == 1
    });
    b.kill();
    // The third worker to get it answers it as the environment's failure.
    let _c = worker(&queue, "c", 0, &cache);
    finish(tune);
    let kept = records(&log);
    assert_eq!(kept.len(), 1);
    assert_eq!(
        kept[0]["result"]["error"]["kind"], "environment",
        "{}",
        kept[0]
    );
    let message = kept[0]["result"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("delivered 3 times"), "{message}");
}

#[test]
fn a_tuner_without_workers_says_so_in_one_line_and_leaves_no_log() {
    let Some(server) = Server::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("none.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args(["tune", "matmul", "--shape", "96,80,64", "--trials", "4"])
        .args([
            "--queue",
            &server.queue("empty"),
            "--queue-wait",
            "1",
            "--log",
        ])
        .arg(&log)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("no worker with a GPU registered on queue"),
        "{err}"
    );
    assert!(!log.exists());
    // A malformed address is refused before anything starts.
    let o = Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args([
            "tune", "matmul", "--shape", "96,80,64", "--queue", "redis:/x", "--log",
        ])
        .arg(&log)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not a redis:// or rediss:// address"), "{err}");
    assert!(!log.exists());
}

const PASSWORD: &str = "pw-4f1c9e0b7d";
const KEY: &str = "queue-key-2b8e6a1f93c4";

/// The tuner's output and its exit status, asserting neither printed the password.
fn finish_quietly(tune: Tuner) -> String {
    let o = tune.output();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{all}");
    assert!(!all.contains(PASSWORD), "the password was printed:\n{all}");
    all
}

#[test]
fn a_queue_with_a_password_refuses_workers_without_it_and_never_prints_it() {
    let Some(server) = Server::start_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    let plain = server.queue("locked");
    // Without the password: refused by the server, in one line.
    let o = worker_command(&plain, "nopw", 0, &cache, 1)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("needs a password"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // With it, in the address (worker) and in the environment (tuner): served, and the
    // password is in no output.
    let with = format!("redis://:{PASSWORD}@127.0.0.1:{}/locked", server.port);
    let worker_err = tmp.path().join("worker.txt");
    let _w = Worker(
        worker_command(&with, "pw", 0, &cache, 1)
            .stderr(std::fs::File::create(&worker_err).unwrap())
            .spawn()
            .unwrap(),
    );
    let log = tmp.path().join("locked.jsonl");
    let mut command = tuner_command(&plain, &log, 8, &[]);
    command.env(queue::PASSWORD_ENV, PASSWORD);
    let tune = Tuner::spawn(command);
    finish_quietly(tune);
    assert_complete(&log, 8);
    let said = std::fs::read_to_string(&worker_err).unwrap();
    assert!(
        said.contains("serving queue redis://:***@127.0.0.1"),
        "{said}"
    );
    assert!(!said.contains(PASSWORD), "{said}");
}

/// A worker on queue `name` (signed, live for its 30 s lease) that dies before taking
/// any job, then a signed tuner of 8 trials, whose jobs therefore wait in the stream;
/// the tuner and its log.
fn jobs_waiting(server: &Server, name: &str, dir: &Path) -> (Tuner, std::path::PathBuf) {
    let queue = server.queue(name);
    let mut first = Worker(
        worker_command(&queue, "first", 0, &dir.join("first"), 30)
            .env(queue::seal::KEY_ENV, KEY)
            .spawn()
            .unwrap(),
    );
    let mut con = server.connection().unwrap();
    wait_until("the first worker registered", || {
        redis::cmd("HLEN")
            .arg(format!("tilesched:{name}:workers"))
            .query::<usize>(&mut con)
            .unwrap()
            == 1
    });
    first.kill();
    let log = dir.join(format!("{name}.jsonl"));
    let mut command = tuner_command(&queue, &log, 8, &[]);
    command.env(queue::seal::KEY_ENV, KEY);
    (Tuner::spawn(command), log)
}

#[test]
fn jobs_not_signed_with_the_queue_key_are_refused_and_never_built() {
    let Some(server) = Server::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    let queue = server.queue("signed");
    let (tune, log) = jobs_waiting(&server, "signed", tmp.path());
    let mut con = server.connection().unwrap();
    let stream: String = {
        let mut found = Vec::new();
        wait_until("jobs published", || {
            found = redis::cmd("KEYS")
                .arg("tilesched:signed:jobs:*")
                .query::<Vec<String>>(&mut con)
                .unwrap();
            !found.is_empty()
                && redis::cmd("XLEN")
                    .arg(&found[0])
                    .query::<usize>(&mut con)
                    .unwrap()
                    > 0
        });
        found[0].clone()
    };
    // A genuine job's fields, then three forgeries of it: unsigned, altered, and signed
    // with another key.
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(1)
        .query(&mut con)
        .unwrap();
    let genuine = &entries.ids[0];
    let field = |name: &str| genuine.get::<String>(name).unwrap();
    let (job, reply, run, gpu) = (field("job"), field("reply"), field("run"), field("gpu"));
    assert!(genuine.get::<String>("sig").is_some(), "jobs are signed");
    let altered = job.replacen("\"seed\":", "\"seed\":1", 1);
    assert_ne!(altered, job);
    let other = queue::Seal::new(b"another-key-0123456789").unwrap();
    let forged = [
        (job.clone(), None),
        (altered, Some(field("sig"))),
        (job.clone(), Some(other.sign(&[&job, &reply, &run, &gpu]))),
    ];
    for (body, sig) in &forged {
        let mut fields = vec![
            ("job", body.clone()),
            ("reply", reply.clone()),
            ("run", run.clone()),
            ("gpu", gpu.clone()),
        ];
        if let Some(sig) = sig {
            fields.push(("sig", sig.clone()));
        }
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg(
                fields
                    .iter()
                    .flat_map(|(k, v)| [k.to_string(), v.clone()])
                    .collect::<Vec<_>>(),
            )
            .query(&mut con)
            .unwrap();
    }
    // A worker with the key measures the tuner's jobs and refuses the forgeries.
    let said_path = tmp.path().join("second.txt");
    let _second = Worker(
        worker_command(&queue, "second", 0, &cache, 1)
            .env(queue::seal::KEY_ENV, KEY)
            .stderr(std::fs::File::create(&said_path).unwrap())
            .spawn()
            .unwrap(),
    );
    finish(tune);
    assert_complete(&log, 8);
    let said = std::fs::read_to_string(&said_path).unwrap();
    assert_eq!(
        said.matches("refused: it is not signed").count(),
        1,
        "{said}"
    );
    assert_eq!(
        said.matches("refused: its signature is not from this queue's key")
            .count(),
        2,
        "{said}"
    );
    // Nothing of them is left, and none was answered (the tuner would have recorded
    // an answer to a job id it had not asked for no more than once, and it recorded
    // exactly its 8).
    wait_until("the forged entries are gone", || {
        redis::cmd("XLEN")
            .arg(&stream)
            .query::<usize>(&mut con)
            .unwrap()
            == 0
    });
}

#[test]
fn a_queue_on_another_host_needs_a_password_and_a_key_or_insecure() {
    // 192.0.2.1 (TEST-NET-1) is never reached: the refusal comes first.
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("x.jsonl");
    for args in [
        vec![
            "worker",
            "--queue",
            "redis://192.0.2.1:6379/q",
            "--simulate",
        ],
        vec!["builder", "--queue", "redis://192.0.2.1:6379/q"],
        vec![
            "tune",
            "matmul",
            "--shape",
            "96,80,64",
            "--queue",
            "redis://192.0.2.1:6379/q",
            "--log",
            log.to_str().unwrap(),
        ],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_tilesched"))
            .args(&args)
            .env_remove(queue::seal::KEY_ENV)
            .env_remove(queue::PASSWORD_ENV)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("on another host") && err.contains("--insecure"),
            "{err}"
        );
        assert!(!log.exists());
    }
}

/// Sends `name` (e.g. "-INT") to the tuner.
fn signal_tuner(tune: &Tuner, name: &str) {
    let pid = tune.id().to_string();
    assert!(
        Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn an_interrupted_tuner_logs_what_its_workers_answer_and_says_what_it_abandons() {
    let Some(server) = Server::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    for (name, kill_worker, signal_name) in
        [("answered", false, "-INT"), ("abandoned", true, "-HUP")]
    {
        let queue = server.queue(name);
        let mut w = worker(&queue, "a", 300, &cache);
        let log = tmp.path().join(format!("{name}.jsonl"));
        let tune = tuner(&queue, &log, 64, &[]);
        wait_until("results logged and jobs held", || {
            records(&log).len() >= 4 && server.held(name, "a") > 0
        });
        let (logged, held) = (records(&log).len(), server.held(name, "a"));
        if kill_worker {
            w.kill();
        }
        signal_tuner(&tune, signal_name);
        let o = tune.output();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        let kept = records(&log);
        let states: HashSet<String> = kept.iter().map(|r| r["state"].to_string()).collect();
        assert_eq!(states.len(), kept.len(), "{name}: a state recorded twice");
        if kill_worker {
            // Nobody answers the jobs the dead worker held: the tuner says so and ends.
            assert!(
                err.contains("job(s) on queue") && err.contains("are abandoned"),
                "{err}"
            );
        } else {
            // The live worker's answers to the jobs it held when the signal came are in.
            assert!(
                kept.len() >= logged + held,
                "{logged} + {held} > {}: {err}",
                kept.len()
            );
            assert!(!err.contains("abandoned"), "{err}");
        }
    }
}

#[test]
fn a_redis_restart_mid_run_loses_nothing_and_records_nothing_twice() {
    let Some(mut server) = Server::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    let queue = server.queue("restart");
    let _a = worker(&queue, "a", 100, &cache);
    let _b = worker(&queue, "b", 100, &cache);
    let log = tmp.path().join("restart.jsonl");
    let tune = tuner(&queue, &log, 48, &[]);
    wait_until("a round is in and jobs are held", || {
        records(&log).len() >= 8 && server.held("restart", "a") + server.held("restart", "b") > 0
    });
    // Down for two seconds, back empty: the tuner and both workers reconnect, the
    // group is made again and the unanswered jobs published again.
    server.restart(Duration::from_secs(2));
    let out = finish(tune);
    assert_complete(&log, 48);
    assert!(out.contains("GPU 0"), "{out}");
}

#[test]
fn a_builder_compiles_the_queued_kernels_and_workers_use_only_untampered_ones() {
    let Some(server) = Server::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let queue = server.queue("built");
    // The builder builds for the dead worker's GPU model.
    let (tune, log) = jobs_waiting(&server, "built", tmp.path());
    let mut con = server.connection().unwrap();
    let builder = Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args([
            "builder",
            "--queue",
            &queue,
            "--name",
            "cpu-host",
            "--threads",
            "1",
        ])
        .arg("--cubin-cache")
        .arg(tmp.path().join("builder"))
        .env(queue::seal::KEY_ENV, KEY)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let builder = Worker(builder);
    // Every job read by the builders' group and built, then the builder stopped: it
    // says what it did.
    wait_until("the builder read the 8 jobs", || {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("tilesched:built:jobs:*")
            .query(&mut con)
            .unwrap();
        keys.iter().any(|k| {
            let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(k)
                .query(&mut con)
                .unwrap();
            groups.iter().any(|g| {
                g.get("name") == Some(&redis::Value::BulkString(b"builders".to_vec()))
                    && g.get("entries-read") == Some(&redis::Value::Int(8))
            })
        })
    });
    // Then built: the store stops growing and no kernel is claimed (being compiled).
    let mut last = (0, Instant::now());
    wait_until("the builder built what it read", || {
        let count = |pattern: &str, con: &mut redis::Connection| {
            redis::cmd("KEYS")
                .arg(pattern)
                .query::<Vec<String>>(con)
                .unwrap()
                .len()
        };
        let stored = count("tilesched:built:cubin:*", &mut con);
        let claimed = count("tilesched:built:cubin-claim:*", &mut con);
        if stored != last.0 || claimed > 0 {
            last = (stored, Instant::now());
        }
        stored > 0 && last.1.elapsed() > Duration::from_millis(1500)
    });
    signal(&builder, "-TERM");
    let mut builder = builder;
    let status = builder.0.wait().unwrap();
    assert!(status.success());
    let mut said = String::new();
    std::io::Read::read_to_string(builder.0.stderr.as_mut().unwrap(), &mut said).unwrap();
    assert!(
        said.contains("builder cpu-host: building for simulated"),
        "{said}"
    );
    assert!(said.contains("0 refused"), "{said}");
    let stored: Vec<String> = redis::cmd("KEYS")
        .arg("tilesched:built:cubin:*")
        .query(&mut con)
        .unwrap();
    assert!(!stored.is_empty(), "{said}");
    // Every entry is signed; one is tampered with (its compiler log, which still reads
    // as one: an altered cubin may not even parse): the worker must not use it, and
    // compiles that kernel itself.
    let text: String = redis::cmd("HGET")
        .arg(&stored[0])
        .arg("log")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&stored[0])
        .arg("log")
        .arg(format!("{text}\n"))
        .query(&mut con)
        .unwrap();
    let mut second = Worker(
        worker_command(&queue, "second", 0, &tmp.path().join("second"), 30)
            .env(queue::seal::KEY_ENV, KEY)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = finish(tune);
    assert_complete(&log, 8);
    signal(&second, "-TERM");
    second.0.wait().unwrap();
    let mut said = String::new();
    std::io::Read::read_to_string(second.0.stderr.as_mut().unwrap(), &mut said).unwrap();
    assert!(
        said.contains("kernel(s) of the queue's store, not signed with the queue's key"),
        "{said}"
    );
    // States whose code is the same share an entry: the tampered one is every such state's.
    let shared = out
        .split(" from the queue's builders")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    assert!((1..8).contains(&shared), "{out}");
}

#[test]
fn a_kernel_claimed_by_a_builder_is_waited_for_not_compiled_twice() {
    use gpu::SharedCubins;
    let Some(server) = Server::start() else {
        return;
    };
    let queue: queue::QueueAddress = server.queue("claims").parse().unwrap();
    let builder = queue::RedisCubins::new(queue.clone(), None);
    let worker = queue::RedisCubins::new(queue, None);
    // Nothing stored, nothing claimed: no wait.
    let started = Instant::now();
    assert_eq!(worker.get("k1"), None);
    assert!(started.elapsed() < Duration::from_millis(500));
    // Claimed: the worker waits until the builder stores it.
    builder.claim("k1");
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            builder.put("k1", b"\x7fELF k1", "log 1");
        });
        assert_eq!(
            worker.get("k1"),
            Some((b"\x7fELF k1".to_vec(), "log 1".to_string()))
        );
    });
    assert!(started.elapsed() >= Duration::from_millis(300));
    // A claim given up (the kernel did not compile) ends the wait with nothing.
    builder.claim("k2");
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            builder.release("k2");
        });
        assert_eq!(worker.get("k2"), None);
    });
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(5));
}
