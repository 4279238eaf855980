//! The tuner's side of the queue: a `measure::Measurer` that publishes jobs on the job
//! stream of its target GPU model and reads the answers from a result stream of its own.
//! A key that it renews says that the run is alive; when the tuner dies the key
//! expires, and workers drop the run's jobs instead of measuring them for nobody.

use crate::address::{QueueAddress, ensure_group, server_ms};
use crate::registry::{self, Registration};
use crate::seal::{self, Seal};
use crate::{FirstError, QueueError};
use gpu::DeviceInfo;
use measure::{Job, MeasureError, Measured, Measurer};
use redis::Commands;
use redis::streams::{StreamReadOptions, StreamReadReply};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// How long a run's key lives without renewal (renewed every second).
const RUN_KEY_MS: u64 = 15_000;
/// How often a silent run says whether any worker is alive.
const SILENCE: Duration = Duration::from_secs(30);

/// Measures through a queue, on the workers of one GPU model.
pub struct Remote {
    queue: QueueAddress,
    target: DeviceInfo,
    devices: usize,
    jobs: String,
    run: String,
    /// The queue's signing key: jobs carry its signature, results without it are refused.
    seal: Option<Seal>,
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

    /// Publishes every job until `jobs` closes or `stop` is set, renewing the run's key.
    fn publish(&self, jobs: &Receiver<Job>, stop: &AtomicBool) -> Result<(), QueueError> {
        let mut con = self.queue.connect(Duration::from_secs(10))?;
        let alive = self.queue.tuner(&self.run);
        let reply = self.queue.results(&self.run);
        let mut renewed: Option<Instant> = None;
        while !stop.load(Ordering::Relaxed) {
            if renewed.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                let _: () = redis::cmd("SET")
                    .arg(&alive)
                    .arg(1)
                    .arg("PX")
                    .arg(RUN_KEY_MS)
                    .query(&mut con)?;
                renewed = Some(Instant::now());
            }
            let job = match jobs.recv_timeout(Duration::from_millis(100)) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let text = serde_json::to_string(&job).expect("jobs serialize");
            let mut fields = vec![
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
            let _: String = con.xadd(&self.jobs, "*", &fields)?;
        }
        Ok(())
    }

    /// Reads results until `done` or `stop` is set, passing each on.
    fn read(
        &self,
        results: &Sender<Measured>,
        done: &AtomicBool,
        stop: &AtomicBool,
    ) -> Result<(), QueueError> {
        let mut con = self.queue.connect(Duration::from_secs(10))?;
        let reply = self.queue.results(&self.run);
        let mut last = "0-0".to_string();
        let mut heard = Instant::now();
        while !stop.load(Ordering::Relaxed) && !done.load(Ordering::Relaxed) {
            let options = StreamReadOptions::default().count(256).block(200);
            let read: Option<StreamReadReply> = con.xread_options(&[&reply], &[&last], &options)?;
            for entry in read.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
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
                if results.send(measured).is_err() {
                    return Ok(());
                }
            }
            if heard.elapsed() >= SILENCE {
                let live = registry::live(&mut con, &self.queue)?;
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
        let published = AtomicBool::new(false);
        let failed = FirstError::new(stop);
        let fail = |e: QueueError| failed.fail(e);
        let this = &*self;
        let (fail, published_ref) = (&fail, &published);
        std::thread::scope(|scope| {
            scope.spawn(move || {
                // The tuner closes `jobs` once every result is in: then reading ends.
                if let Err(e) = this.publish(&jobs, stop) {
                    fail(e);
                }
                published_ref.store(true, Ordering::Relaxed);
            });
            if let Err(e) = this.read(&results, &published, stop) {
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
