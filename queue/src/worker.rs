//! A GPU host's side of the queue: reads jobs for its GPU model as a member of the job
//! stream's consumer group, builds and measures them with `measure::Local` on its own
//! cores and GPUs, posts each result to the tuner that asked, then acknowledges the
//! job. While it holds a job it renews it (`XCLAIM ... JUSTID`, which resets the job's
//! idle time without counting a delivery); a job left idle longer than the lease
//! belongs to a dead (or frozen) worker and is taken over with `XAUTOCLAIM`; a worker
//! told to stop hands back what it will not answer, so that this happens at once. Redis
//! counts deliveries: a job delivered a third time has killed, or outlived, two workers
//! and is answered as an `environment` failure instead of being measured again. When
//! Redis goes away, every thread reconnects with backoff (up to two minutes) and makes
//! the job stream's consumer group again where the server lost it. Before compiling a
//! kernel, a worker with a cubin cache looks in the queue's store of kernels
//! (`cubins`), which CPU-only builders fill.

use crate::address::{GROUP, QueueAddress, ensure_group};
use crate::cubins::RedisCubins;
use crate::registry::{self, Registration, renew_period};
use crate::seal::{self, Seal};
use crate::{FirstError, QueueError};
use gpu::{CubinCache, DeviceInfo, ErrorKind, Outcome, Pool};
use measure::{Job, Local, Measured, Measurer};
use redis::Commands;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamClaimOptions, StreamId,
    StreamPendingCountReply, StreamReadOptions, StreamReadReply,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest wait for one reply of Redis (longer than any `BLOCK`).
const READ: Duration = Duration::from_secs(10);
/// Deliveries of one job: the first, and one more after its worker died.
const MAX_DELIVERIES: usize = 2;
/// A result stream lives this long after its last result: the tuner deletes it when
/// its run ends, and an answer posted just after that must not leave it behind forever.
const RESULTS_TTL_MS: u64 = 10 * 60 * 1000;

/// How a worker serves a queue.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub queue: QueueAddress,
    /// Its consumer name (unique on the queue).
    pub name: String,
    /// A job it holds and does not renew for this long is taken over by another.
    pub lease: Duration,
    /// Build threads.
    pub builders: usize,
    /// Where cubins are written for the measuring processes.
    pub workdir: PathBuf,
    pub cache: Option<CubinCache>,
    /// The queue's signing key: jobs without its signature are refused, results carry it.
    pub seal: Option<Seal>,
}

/// This host's name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_string())
}

/// A job this worker holds: where it came from and where its answer goes.
#[derive(Debug, Clone)]
struct Held {
    /// The job's entry in the job stream.
    entry: String,
    reply: String,
    run: String,
    /// The tuner's id of the job (jobs are renumbered here: ids are per tuner).
    job_id: u64,
}

/// The jobs a worker holds, by its own number for them.
#[derive(Default)]
struct Holding {
    jobs: HashMap<u64, Held>,
    next: u64,
}

impl Holding {
    fn holds_entry(&self, entry: &str) -> bool {
        self.jobs.values().any(|h| h.entry == entry)
    }
}

/// Serves the queue with `pool` until `stop` is set or measuring fails (a GPU whose
/// worker cannot be restarted). It then answers the jobs being measured, hands back the
/// others (other workers take them over at once) and removes its registration.
/// `notice` receives lines for people.
pub fn serve(
    pool: &mut Pool,
    cfg: WorkerConfig,
    stop: &AtomicBool,
    notice: &(dyn Fn(&str) + Sync),
) -> Result<(), QueueError> {
    let devices: Vec<DeviceInfo> = pool.devices().into_iter().cloned().collect();
    let gpu = devices[0].name.clone();
    let stream = cfg.queue.jobs(&gpu);
    let mut con = cfg.queue.connect(Duration::from_secs(10))?;
    ensure_group(&mut con, &stream)?;
    let mut me = Registration {
        worker: cfg.name.clone(),
        host: host_name(),
        pid: std::process::id(),
        devices: devices.clone(),
        lease_ms: cfg.lease.as_millis() as u64,
        seen_ms: 0,
    };
    registry::renew(&mut con, &cfg.queue, &mut me)?;
    notice(&format!(
        "worker {}: {} x {gpu}, serving queue {} ({} build threads, lease {:.1} s)",
        cfg.name,
        devices.len(),
        cfg.queue,
        cfg.builders,
        cfg.lease.as_secs_f64()
    ));
    let nvrtc = gpu::nvrtc_lib::version()
        .map(|(a, b)| format!("{a}.{b}"))
        .map_err(measure::LocalError::from)?;
    let capacity = cfg.builders + 2 * devices.len();
    let holding = Mutex::new(Holding::default());
    let hold = || holding.lock().unwrap_or_else(|p| p.into_inner());
    let failed = FirstError::new(stop);
    let fail = |e: QueueError| failed.fail(e);
    // Kernels the queue's builders compiled are read back, not compiled here.
    let store = Arc::new(RedisCubins::new(cfg.queue.clone(), cfg.seal.clone()));
    let cache = cfg
        .cache
        .clone()
        .map(|c| c.with_shared(Arc::clone(&store) as _, false));
    let mut local = Local::new(
        pool,
        cfg.builders,
        cfg.workdir.clone(),
        cache,
        cfg.name.clone(),
    )?;
    let (job_tx, job_rx) = channel::<Job>();
    let (result_tx, result_rx) = channel::<Measured>();
    let fetching_done = AtomicBool::new(false);
    let (cfg, stream, hold, fail, fetching_done) = (&cfg, &stream, &hold, &fail, &fetching_done);
    // After Redis comes back, the job stream's consumer group may have to be made again
    // (a server restarted without its data); the registration comes back with the next
    // renewal, and the tuner publishes again what it still waits for.
    let regroup = |con: &mut redis::Connection| ensure_group(con, stream);
    let measured = std::thread::scope(|scope| {
        let measuring = scope.spawn(|| local.serve(job_rx, result_tx, stop));
        // Posts each result, then acknowledges its job.
        scope.spawn(move || {
            let post = || -> Result<(), QueueError> {
                let mut con = cfg.queue.connect(Duration::from_secs(10))?;
                for mut m in result_rx.iter() {
                    let local_id = m.id;
                    let Some(held) = hold().jobs.get(&local_id).cloned() else {
                        continue;
                    };
                    m.id = held.job_id;
                    cfg.queue
                        .retrying(&mut con, READ, stop, notice, regroup, |con| {
                            answer(con, cfg, stream, &held, &m)
                        })?;
                    hold().jobs.remove(&local_id);
                }
                Ok(())
            };
            if let Err(e) = post() {
                fail(e);
            }
        });
        // Renews the registration and the jobs held.
        let me = &me;
        scope.spawn(move || {
            let renew = || -> Result<(), QueueError> {
                let mut con = cfg.queue.connect(Duration::from_secs(10))?;
                let mut me = me.clone();
                let over = || stop.load(Ordering::Relaxed) || fetching_done.load(Ordering::Relaxed);
                loop {
                    // In short steps: a stopped worker must not wait out a period.
                    let period = std::time::Instant::now() + renew_period(cfg.lease);
                    while !over() && std::time::Instant::now() < period {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    if over() {
                        break;
                    }
                    let entries: Vec<String> =
                        hold().jobs.values().map(|h| h.entry.clone()).collect();
                    cfg.queue
                        .retrying(&mut con, READ, stop, notice, regroup, |con| {
                            registry::renew(con, &cfg.queue, &mut me)?;
                            renew_jobs(con, stream, &cfg.name, &entries)
                        })?;
                }
                Ok(())
            };
            if let Err(e) = renew() {
                fail(e);
            }
        });
        // Fetches jobs while there is room: first those of dead workers, then new ones.
        let mut fetch = || -> Result<(), QueueError> {
            while !stop.load(Ordering::Relaxed) {
                let room = capacity.saturating_sub(hold().jobs.len());
                if room == 0 {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let mut entries = Vec::new();
                let claimed = cfg
                    .queue
                    .retrying(&mut con, READ, stop, notice, regroup, |con| {
                        take_over(con, stream, cfg, room)
                    })?;
                for entry in claimed {
                    if hold().holds_entry(&entry.0.id) {
                        continue; // its own, renewed late
                    }
                    if entry.1 > MAX_DELIVERIES {
                        cfg.queue
                            .retrying(&mut con, READ, stop, notice, regroup, |con| {
                                give_up(con, cfg, stream, &entry.0, &devices[0], &nvrtc, entry.1)
                            })?;
                    } else {
                        entries.push(entry.0);
                    }
                }
                if entries.is_empty() {
                    let options = StreamReadOptions::default()
                        .group(GROUP, &cfg.name)
                        .count(room)
                        .block(500);
                    let read: Option<StreamReadReply> =
                        cfg.queue
                            .retrying(&mut con, READ, stop, notice, regroup, |con| {
                                Ok(con.xread_options(&[&stream], &[">"], &options)?)
                            })?;
                    entries.extend(read.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids));
                }
                for entry in entries {
                    let accepted =
                        cfg.queue
                            .retrying(&mut con, READ, stop, notice, regroup, |con| {
                                accept(con, cfg, stream, &entry, notice)
                            })?;
                    let Some((job, held)) = accepted else {
                        continue;
                    };
                    if let Err(why) = check_job(&job) {
                        notice(&format!("job {} refused before building: {why}", entry.id));
                        let m = failure(
                            job.id,
                            ErrorKind::Compile,
                            format!("the worker refused the job: {why}"),
                            &devices[0],
                            &nvrtc,
                            cfg,
                        );
                        cfg.queue
                            .retrying(&mut con, READ, stop, notice, regroup, |con| {
                                answer(con, cfg, stream, &held, &m)
                            })?;
                        continue;
                    }
                    let mut holding = hold();
                    let local_id = holding.next;
                    holding.next += 1;
                    holding.jobs.insert(local_id, held);
                    drop(holding);
                    if job_tx
                        .send(Job {
                            id: local_id,
                            ..job
                        })
                        .is_err()
                    {
                        return Ok(());
                    }
                }
            }
            Ok(())
        };
        if let Err(e) = fetch() {
            fail(e);
        }
        fetching_done.store(true, Ordering::Relaxed);
        drop(job_tx);
        measuring
            .join()
            .expect("the measuring thread does not panic")
    });
    // What it still has pending was not answered (held, or read as it stopped): it
    // hands it back.
    match hand_back(&mut con, stream, &cfg.name, cfg.lease) {
        Ok(0) => {}
        Ok(n) => notice(&format!(
            "worker {}: handed back {n} job(s) it had not answered",
            cfg.name
        )),
        Err(e) => notice(&format!(
            "worker {}: could not hand back its unanswered jobs ({e}); other workers take them over after the lease",
            cfg.name
        )),
    }
    let _ = registry::remove(&mut con, &cfg.queue, &cfg.name);
    if store.refused() > 0 {
        notice(&format!(
            "worker {}: refused {} kernel(s) of the queue's store, not signed with the queue's key, and compiled them here",
            cfg.name,
            store.refused()
        ));
    }
    if let Some(e) = failed.into_inner() {
        return Err(e);
    }
    measured.map_err(QueueError::Measure)
}

/// Whether the tuner of `run` is still there.
fn run_alive(
    con: &mut redis::Connection,
    queue: &QueueAddress,
    run: &str,
) -> Result<bool, QueueError> {
    Ok(con.exists(queue.tuner(run))?)
}

/// Reads a job entry: `None` (and the entry acknowledged and deleted) when it cannot
/// be read, is not signed with the queue's key (where the worker has one), or its tuner
/// is gone. Nothing of an unsigned job is read but its fields.
fn accept(
    con: &mut redis::Connection,
    cfg: &WorkerConfig,
    stream: &str,
    entry: &StreamId,
    notice: &(dyn Fn(&str) + Sync),
) -> Result<Option<(Job, Held)>, QueueError> {
    let parsed = read_job(cfg.seal.as_ref(), entry);
    let keep = match &parsed {
        Ok((_, _, run)) => run_alive(con, &cfg.queue, run)?,
        Err(why) => {
            notice(&format!("job {} dropped: {why}", entry.id));
            false
        }
    };
    if !keep {
        finish(con, stream, &entry.id)?;
        return Ok(None);
    }
    let (job, reply, run) = parsed.expect("checked above");
    let held = Held {
        entry: entry.id.clone(),
        reply,
        run,
        job_id: job.id,
    };
    Ok(Some((job, held)))
}

/// A job entry's job, reply stream and run; why not when a field is missing or does not
/// read, or (with `seal`) the entry is not signed with the queue's key. Nothing of an
/// unsigned job is read but its fields.
pub(crate) fn read_job(
    seal: Option<&Seal>,
    entry: &StreamId,
) -> Result<(Job, String, String), String> {
    let field = |name: &str| entry.get::<String>(name);
    let (Some(job), Some(reply), Some(run)) = (field("job"), field("reply"), field("run")) else {
        return Err("a field is missing".to_string());
    };
    if let Some(seal) = seal {
        let gpu = field("gpu").unwrap_or_default();
        seal.verify(&[&job, &reply, &run, &gpu], field(seal::FIELD).as_deref())
            .map_err(|e| format!("refused: {e}"))?;
    }
    let job = serde_json::from_str::<Job>(&job).map_err(|e| e.to_string())?;
    Ok((job, reply, run))
}

/// Refuses a job that no tuner writes: a task that is not valid (its tensors too large
/// among the reasons) or not in its canonical form, or a timing protocol out of range.
/// Checked before anything is built, so a malformed job is a failure, never a panic.
pub(crate) fn check_job(job: &Job) -> Result<(), String> {
    let t = &job.task;
    let canonical = schedule::Task::new(t.op, t.epilogue)
        .and_then(|c| c.with_types(t.dtype, t.out_dtype, t.layout))
        .map_err(|e| format!("its task is not valid: {e}"))?;
    if canonical != *t {
        return Err(format!(
            "its task is not written as tilesched writes it ({})",
            canonical.key()
        ));
    }
    let timing = &job.timing;
    let sane = timing.warmup <= 1000
        && timing.min_repeats <= timing.max_repeats
        && timing.max_repeats <= 100_000
        && timing.min_time_ms.is_finite()
        && (0.0..=10_000.0).contains(&timing.min_time_ms)
        && timing.race_us.is_none_or(|r| r.is_finite() && r >= 0.0)
        && timing
            .precision
            .is_none_or(|p| p.is_finite() && p > 0.0 && p < 1.0)
        && job.timeout <= Duration::from_secs(600);
    if !sane {
        return Err("its timing protocol is out of range".to_string());
    }
    Ok(())
}

/// A job's answer when it was not measured.
fn failure(
    id: u64,
    kind: ErrorKind,
    message: String,
    device: &DeviceInfo,
    nvrtc: &str,
    cfg: &WorkerConfig,
) -> Measured {
    Measured {
        id,
        source_hash: None,
        compile: None,
        cached: false,
        shared: false,
        nvrtc: nvrtc.to_string(),
        outcome: Outcome::error(kind, message),
        device: device.clone(),
        worker: cfg.name.clone(),
        measure_ms: 0.0,
        phases: Default::default(),
    }
}

/// Acknowledges and deletes a job entry.
fn finish(con: &mut redis::Connection, stream: &str, entry: &str) -> Result<(), QueueError> {
    let _: usize = con.xack(stream, GROUP, &[entry])?;
    let _: usize = con.xdel(stream, &[entry])?;
    Ok(())
}

/// Posts a result to the job's tuner (if it is still there), then acknowledges the job:
/// dying in between only makes the job be measured again, and the tuner ignores the
/// second answer.
fn answer(
    con: &mut redis::Connection,
    cfg: &WorkerConfig,
    stream: &str,
    held: &Held,
    m: &Measured,
) -> Result<(), QueueError> {
    if run_alive(con, &cfg.queue, &held.run)? {
        let text = serde_json::to_string(m).expect("results serialize");
        let mut fields = vec![("result", text.clone())];
        if let Some(seal) = &cfg.seal {
            fields.push((seal::FIELD, seal.sign(&[&text, &held.reply])));
        }
        let _: () = redis::pipe()
            .atomic()
            .xadd(&held.reply, "*", &fields)
            .ignore()
            .pexpire(&held.reply, RESULTS_TTL_MS as i64)
            .ignore()
            .query(con)?;
    }
    finish(con, stream, &held.entry)
}

/// Jobs idle for longer than the lease (their worker died or stopped), claimed for
/// `cfg.name`, each with how often it has now been delivered.
fn take_over(
    con: &mut redis::Connection,
    stream: &str,
    cfg: &WorkerConfig,
    room: usize,
) -> Result<Vec<(StreamId, usize)>, QueueError> {
    let options = StreamAutoClaimOptions::default().count(room);
    let lease_ms = cfg.lease.as_millis() as u64;
    let claimed: StreamAutoClaimReply =
        con.xautoclaim_options(stream, GROUP, &cfg.name, lease_ms, "0-0", options)?;
    let mut out = Vec::new();
    for entry in claimed.claimed {
        let pending: StreamPendingCountReply = redis::cmd("XPENDING")
            .arg(stream)
            .arg(GROUP)
            .arg(&entry.id)
            .arg(&entry.id)
            .arg(1)
            .query(con)?;
        let times = pending.ids.first().map_or(1, |p| p.times_delivered);
        out.push((entry, times));
    }
    Ok(out)
}

/// Answers a job that outlived two workers as an `environment` failure.
fn give_up(
    con: &mut redis::Connection,
    cfg: &WorkerConfig,
    stream: &str,
    entry: &StreamId,
    device: &DeviceInfo,
    nvrtc: &str,
    times: usize,
) -> Result<(), QueueError> {
    let noop = |_: &str| {};
    let Some((job, held)) = accept(con, cfg, stream, entry, &noop)? else {
        return Ok(());
    };
    let m = failure(
        job.id,
        ErrorKind::Environment,
        format!(
            "delivered {times} times: the workers that took it died or stopped before answering; not measured again"
        ),
        device,
        nvrtc,
        cfg,
    );
    answer(con, cfg, stream, &held, &m)
}

/// Resets the idle time of the jobs `name` holds (without counting a delivery), so
/// that no other worker takes them over while they are built and measured.
fn renew_jobs(
    con: &mut redis::Connection,
    stream: &str,
    name: &str,
    held: &[String],
) -> Result<(), QueueError> {
    if held.is_empty() {
        return Ok(());
    }
    // Only what is still this worker's: a job taken over while it was stopped stays
    // with the worker that took it.
    let ids: Vec<String> = pending(con, stream, name)?
        .into_iter()
        .filter(|id| held.contains(id))
        .collect();
    set_idle(con, stream, name, &ids, 0)
}

/// Hands back every job `name` still has pending, none of which it will answer (it
/// stops): with their idle time set to the lease, the next worker to look takes them
/// over at once instead of a lease later. Returns how many.
fn hand_back(
    con: &mut redis::Connection,
    stream: &str,
    name: &str,
    lease: Duration,
) -> Result<usize, QueueError> {
    let ids = pending(con, stream, name)?;
    set_idle(con, stream, name, &ids, lease.as_millis() as usize)?;
    Ok(ids.len())
}

/// The jobs of `stream` delivered to `name` and not yet acknowledged.
fn pending(
    con: &mut redis::Connection,
    stream: &str,
    name: &str,
) -> Result<Vec<String>, QueueError> {
    let pending: StreamPendingCountReply = redis::cmd("XPENDING")
        .arg(stream)
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(10_000)
        .arg(name)
        .query(con)?;
    Ok(pending.ids.into_iter().map(|p| p.id).collect())
}

/// Sets the idle time of `ids`, held by `name`, without counting a delivery.
fn set_idle(
    con: &mut redis::Connection,
    stream: &str,
    name: &str,
    ids: &[String],
    idle_ms: usize,
) -> Result<(), QueueError> {
    if !ids.is_empty() {
        let options = StreamClaimOptions::default().idle(idle_ms).with_justid();
        let _: Vec<String> = con.xclaim_options(stream, GROUP, name, 0, ids, options)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use schedule::{Epilogue, Operator, Task};

    fn job(task: Task) -> Job {
        let state = serde_json::from_str(
            r#"{"spatial":[{"vthread":1,"thread":8,"outer":1,"inner":2},{"vthread":1,"thread":16,"outer":1,"inner":2}],"reduction":[{"middle":8,"inner":2}],"unroll_max_step":16,"vector_width":[1,1]}"#,
        )
        .unwrap();
        Job {
            id: 7,
            task,
            state,
            injected: None,
            seed: 1,
            timing: gpu::TimingConfig::default(),
            timeout: Duration::from_secs(10),
            race: false,
        }
    }

    fn matmul(m: u32, n: u32, k: u32) -> Task {
        Task::new(Operator::Matmul { m, n, k }, Epilogue::default()).unwrap()
    }

    #[test]
    fn jobs_no_tuner_writes_are_refused_before_building() {
        check_job(&job(matmul(64, 64, 64))).unwrap();
        let mut zero = job(matmul(64, 64, 64));
        zero.task.op = Operator::Matmul { m: 64, n: 0, k: 64 };
        assert!(check_job(&zero).unwrap_err().contains("task is not valid"));
        let mut huge = job(matmul(64, 64, 64));
        huge.task.op = Operator::Matmul {
            m: 1 << 20,
            n: 16,
            k: 1 << 20,
        };
        assert!(check_job(&huge).unwrap_err().contains("task is not valid"));
        let mut slow = job(matmul(64, 64, 64));
        slow.timing.max_repeats = 1_000_000_000;
        assert!(check_job(&slow).unwrap_err().contains("timing protocol"));
        let mut late = job(matmul(64, 64, 64));
        late.timeout = Duration::from_secs(86_400);
        assert!(check_job(&late).unwrap_err().contains("timing protocol"));
        let mut precise = job(matmul(64, 64, 64));
        precise.timing.precision = Some(0.005);
        check_job(&precise).unwrap();
        for bad in [0.0, 1.0, f64::NAN, -0.1] {
            precise.timing.precision = Some(bad);
            assert!(check_job(&precise).unwrap_err().contains("timing protocol"));
        }
        // A conv2d with an end pad that changes nothing is not how a tuner writes it.
        let conv = schedule::parse_shape("conv2d", "1,8,8,8,8,3,3,1,1").unwrap();
        let mut padded = job(Task::new(conv, Epilogue::default()).unwrap());
        if let Operator::Conv2d(c) = &mut padded.task.op {
            c.pad_bottom = Some(1);
        }
        assert!(
            check_job(&padded)
                .unwrap_err()
                .contains("not written as tilesched writes it")
        );
    }
}
