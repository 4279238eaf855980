//! The tuner's side of the queue: a `measure::Measurer` that publishes jobs on the job
//! stream of its target GPU model and reads the answers from a result stream of its own.
//! A key that it renews says that the run is alive; when the tuner dies the key
//! expires, and workers drop the run's jobs instead of measuring them for nobody.
//! When Redis goes away, both threads reconnect with backoff; a run key found missing
//! afterwards (the server restarted without its data, or was gone long enough for the
//! key to expire) means the jobs not yet answered may be gone too, and they are
//! published again. A job answered twice is recorded once: the tuner keeps the first.

use crate::address::{QueueAddress, ensure_group, server_ms};
use crate::registry::{self, Registration};
use crate::seal::{self, Seal};
use crate::{FirstError, QueueError};
use gpu::DeviceInfo;
use measure::{Job, MeasureError, Measured, Measurer};
use redis::Commands;
use redis::streams::{StreamReadOptions, StreamReadReply};
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// How long a run's key lives without renewal (renewed every second).
const RUN_KEY_MS: u64 = 15_000;
/// How often a silent run says whether any worker is alive.
const SILENCE: Duration = Duration::from_secs(30);
/// The longest a stopped run waits for the answers to the jobs it published.
const MAX_DRAIN: Duration = Duration::from_secs(30);

/// A job's fields on the stream, as published.
type Fields = Vec<(&'static str, String)>;

/// What the publishing and reading threads of one run share.
#[derive(Default)]
struct Shared {
    /// The published jobs not answered yet, by id: what is published again when the
    /// server may have lost them.
    unanswered: Mutex<BTreeMap<u64, Fields>>,
    /// Set by the reader when the run's key was gone.
    republish: AtomicBool,
}

impl Shared {
    fn unanswered(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Fields>> {
        self.unanswered.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Measures through a queue, on the workers of one GPU model.
pub struct Remote {
    queue: QueueAddress,
    target: DeviceInfo,
    devices: usize,
    jobs: String,
    run: String,
    /// The queue's signing key: jobs carry its signature, results without it are refused.
    seal: Option<Seal>,
    /// How long a stopped run waits for the answers to its published jobs.
    drain: Duration,
    notice: Box<dyn Fn(&str) + Send + Sync>,
}

impl Remote {
    /// Connects to `queue` and waits up to `wait` for a live worker whose GPU name
    /// contains `gpu` (any, if None): the first found decides the target model. All
    /// live workers of that model count toward how much is kept in flight. `notice`
    /// receives lines for people (who serves, what is waited for). With `seal`, jobs are
    /// signed and results must be.
    pub fn connect(
        queue: QueueAddress,
        gpu: Option<&str>,
        wait: Duration,
        seal: Option<Seal>,
        notice: Box<dyn Fn(&str) + Send + Sync>,
    ) -> Result<Remote, QueueError> {
        let mut con = queue.connect(Duration::from_secs(10))?;
        let started = Instant::now();
        let mut said: Option<Instant> = None;
        let wanted = gpu.map_or("a GPU".to_string(), |g| format!("a GPU named *{g}*"));
        loop {
            let live = registry::live(&mut con, &queue)?;
            let fits = |r: &&Registration| gpu.is_none_or(|g| r.gpu().contains(g));
            let matching: Vec<&Registration> = live.iter().filter(fits).collect();
            let models: BTreeSet<&str> = matching.iter().map(|r| r.gpu()).collect();
            if models.len() > 1 {
                return Err(QueueError::MixedGpus {
                    queue: queue.to_string(),
                    models: models.into_iter().collect::<Vec<_>>().join(", "),
                });
            }
            if let Some(&model) = models.first() {
                for r in live.iter().filter(|r| r.gpu() != model) {
                    notice(&format!(
                        "worker {} has {}, not {model}: it takes no jobs of this run",
                        r.worker,
                        r.gpu()
                    ));
                }
                let devices: usize = matching.iter().map(|r| r.devices.len()).sum();
                let names: Vec<&str> = matching.iter().map(|r| r.worker.as_str()).collect();
                notice(&format!(
                    "queue {queue}: {} worker(s) with {devices} x {model} ({})",
                    matching.len(),
                    names.join(", ")
                ));
                let host = crate::worker::host_name();
                let run = format!("{host}-{}-{}", std::process::id(), server_ms(&mut con)?);
                return Ok(Remote {
                    jobs: queue.jobs(model),
                    target: matching[0].devices[0].clone(),
                    devices,
                    queue,
                    run,
                    seal,
                    drain: wait.min(MAX_DRAIN),
                    notice,
                });
            }
            if started.elapsed() >= wait {
                let seen: Vec<String> = live
                    .iter()
                    .map(|r| format!("{} ({})", r.worker, r.gpu()))
                    .collect();
                return Err(QueueError::NoWorker {
                    queue: queue.to_string(),
                    wanted,
                    waited_s: wait.as_secs(),
                    seen: if seen.is_empty() {
                        String::new()
                    } else {
                        format!("; live: {}", seen.join(", "))
                    },
                });
            }
            if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                notice(&format!(
                    "waiting for a worker with {wanted} on queue {queue} (start `tilesched worker --queue {queue}` on a GPU host)"
                ));
                said = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Publishes every job until `jobs` closes or `stop` is set, keeping each in
    /// `unanswered` (which the reader empties); publishes those
    /// again whenever `republish` is set.
    fn publish(
        &self,
        jobs: &Receiver<Job>,
        stop: &AtomicBool,
        shared: &Shared,
    ) -> Result<(), QueueError> {
        let read = Duration::from_secs(10);
        let mut con = self.queue.connect(read)?;
        let reply = self.queue.results(&self.run);
        let notice = |line: &str| (self.notice)(line);
        let post = |con: &mut redis::Connection, fields: &[(&str, String)]| {
            self.queue.retrying(
                con,
                read,
                stop,
                &notice,
                |_| Ok(()),
                |con| {
                    let _: String = con.xadd(&self.jobs, "*", fields)?;
                    Ok(())
                },
            )
        };
        while !stop.load(Ordering::Relaxed) {
            if shared.republish.swap(false, Ordering::Relaxed) {
                let again: Vec<Fields> = shared.unanswered().values().cloned().collect();
                if !again.is_empty() {
                    notice(&format!(
                        "publishing the {} unanswered job(s) again: the run's key was gone from Redis",
                        again.len()
                    ));
                }
                for fields in &again {
                    post(&mut con, fields)?;
                }
            }
            let job = match jobs.recv_timeout(Duration::from_millis(100)) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let text = serde_json::to_string(&job).expect("jobs serialize");
            let mut fields: Fields = vec![
                ("job", text.clone()),
                ("reply", reply.clone()),
                ("run", self.run.clone()),
                ("gpu", self.target.name.clone()),
            ];
            if let Some(seal) = &self.seal {
                fields.push((
                    seal::FIELD,
                    seal.sign(&[&text, &reply, &self.run, &self.target.name]),
                ));
            }
            shared.unanswered().insert(job.id, fields.clone());
            post(&mut con, &fields)?;
        }
        Ok(())
    }

    /// Says the run is alive for another `RUN_KEY_MS`; false when its key was gone.
    fn renew(&self, con: &mut redis::Connection) -> Result<bool, QueueError> {
        let previous: Option<String> = redis::cmd("SET")
            .arg(self.queue.tuner(&self.run))
            .arg(1)
            .arg("PX")
            .arg(RUN_KEY_MS)
            .arg("GET")
            .query(con)?;
        Ok(previous.is_some())
    }

    /// Reads results until `done` is set, passing each on and keeping the run alive.
    /// Once `stop` is set (the tuner was interrupted, or a thread failed), it goes on
    /// until every published job is answered or `drain` has passed, then says how many
    /// it abandons.
    fn read(
        &self,
        results: &Sender<Measured>,
        done: &AtomicBool,
        stop: &AtomicBool,
        shared: &Shared,
    ) -> Result<(), QueueError> {
        let read = Duration::from_secs(10);
        let notice = |line: &str| (self.notice)(line);
        let mut con = self.queue.connect(read)?;
        let reply = self.queue.results(&self.run);
        let mut last = "0-0".to_string();
        let mut heard = Instant::now();
        let mut renewed = Instant::now();
        let mut stopped: Option<Instant> = None;
        while !done.load(Ordering::Relaxed) {
            if stop.load(Ordering::Relaxed) {
                let since = *stopped.get_or_insert_with(Instant::now);
                let outstanding = shared.unanswered().len();
                if outstanding == 0 {
                    break;
                }
                if since.elapsed() >= self.drain {
                    (self.notice)(&format!(
                        "stopping: {outstanding} job(s) on queue {} not answered within {} s are abandoned",
                        self.queue,
                        self.drain.as_secs()
                    ));
                    break;
                }
            }
            if renewed.elapsed() >= Duration::from_secs(1) {
                let alive = self.queue.retrying(
                    &mut con,
                    read,
                    stop,
                    &notice,
                    |_| Ok(()),
                    |con| self.renew(con),
                )?;
                if !alive {
                    shared.republish.store(true, Ordering::Relaxed);
                }
                renewed = Instant::now();
            }
            let options = StreamReadOptions::default().count(256).block(200);
            let replies: Option<StreamReadReply> = self.queue.retrying(
                &mut con,
                read,
                stop,
                &notice,
                |_| Ok(()),
                |con| Ok(con.xread_options(&[&reply], &[&last], &options)?),
            )?;
            for entry in replies.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                last = entry.id.clone();
                let text: String = entry.get("result").ok_or_else(|| {
                    QueueError::Message(format!("result {} has no body", entry.id))
                })?;
                if let Some(seal) = &self.seal {
                    let signature = entry.get::<String>(seal::FIELD);
                    if let Err(e) = seal.verify(&[&text, &reply], signature.as_deref()) {
                        (self.notice)(&format!("result {} refused: {e}", entry.id));
                        continue;
                    }
                }
                let measured: Measured = serde_json::from_str(&text)
                    .map_err(|e| QueueError::Message(format!("result {}: {e}", entry.id)))?;
                heard = Instant::now();
                shared.unanswered().remove(&measured.id);
                if results.send(measured).is_err() {
                    return Ok(());
                }
            }
            if heard.elapsed() >= SILENCE {
                let live = self.queue.retrying(
                    &mut con,
                    read,
                    stop,
                    &notice,
                    |_| Ok(()),
                    |con| registry::live(con, &self.queue),
                )?;
                let serving = live.iter().filter(|r| r.gpu() == self.target.name).count();
                (self.notice)(&format!(
                    "no result for {} s; {serving} live worker(s) with {} on queue {}: the jobs wait for one",
                    SILENCE.as_secs(),
                    self.target.name,
                    self.queue
                ));
                heard = Instant::now();
            }
        }
        Ok(())
    }
}

impl Measurer for Remote {
    fn target(&self) -> &DeviceInfo {
        &self.target
    }

    fn parallelism(&self) -> usize {
        self.devices.max(1)
    }

    fn serve(
        &mut self,
        jobs: Receiver<Job>,
        results: Sender<Measured>,
        stop: &AtomicBool,
    ) -> Result<(), MeasureError> {
        let mut con = self.queue.connect(Duration::from_secs(10))?;
        ensure_group(&mut con, &self.jobs)?;
        // Alive before the first job, so that no worker drops it.
        self.renew(&mut con)?;
        let published = AtomicBool::new(false);
        let shared = Shared::default();
        let failed = FirstError::new(stop);
        let fail = |e: QueueError| failed.fail(e);
        let this = &*self;
        let (fail, published_ref, shared) = (&fail, &published, &shared);
        std::thread::scope(|scope| {
            scope.spawn(move || {
                // The tuner closes `jobs` once every result is in: then reading ends.
                let outcome = this.publish(&jobs, stop, shared);
                if let Err(e) = outcome {
                    fail(e);
                } else if !stop.load(Ordering::Relaxed) {
                    published_ref.store(true, Ordering::Relaxed);
                }
            });
            if let Err(e) = this.read(&results, &published, stop, shared) {
                fail(e);
            }
        });
        // The run is over: its key and results go; workers drop any job left of it.
        let _: Result<(), _> =
            con.del(&[self.queue.tuner(&self.run), self.queue.results(&self.run)]);
        match failed.into_inner() {
            Some(e) => Err(Box::new(e)),
            None => Ok(()),
        }
    }
}
