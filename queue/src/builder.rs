//! A CPU-only host's side of the queue: `tilesched builder` reads every job of the
//! queue's job streams as a member of a consumer group of its own (the builders'), and
//! compiles each job's kernel into the queue's store of cubins (`cubins`), where the
//! GPU worker that measures the job finds it instead of compiling it. With tune's
//! defaults a GPU measures several times what its host's cores compile (an H200 with 16
//! cores: 150 candidates per GPU-second, 30-40 builds per second), so a GPU host's
//! cores, not its GPUs, bound a run; builders lend it other hosts' cores.
//!
//! A builder is only ever a shortcut: it acknowledges nothing (`NOACK`) and holds no
//! job, so a builder that dies, lags or compiles with another NVRTC loses nothing and
//! doubles nothing: the worker compiles what it does not find. To spend its cores where
//! they help, it builds the newest jobs first (workers take the oldest), claims each
//! kernel while it compiles it (a worker that wants it waits), and leaves alone a job
//! that a worker has already taken (its entry is in the workers' pending list) or
//! answered (the entry is gone). It builds for the GPU models of the live workers, from
//! their registrations (architecture and limits).

use crate::QueueError;
use crate::address::{BUILDERS, GROUP, QueueAddress, ensure_group_named};
use crate::cubins::{BestEffort, RedisCubins};
use crate::registry;
use crate::seal::Seal;
use crate::worker::{check_job, read_job};
use gpu::{CubinCache, Origin};
use measure::Job;
use measure::build::build_candidate;
use redis::Commands;
use redis::streams::{
    StreamPendingCountReply, StreamRangeReply, StreamReadOptions, StreamReadReply,
};
use schedule::GpuSpec;
use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest wait for one reply of Redis (longer than any `BLOCK`).
const READ: Duration = Duration::from_secs(10);
/// How often the live workers' GPU models are read again.
const REFRESH: Duration = Duration::from_secs(2);
/// How often a builder says what it did.
const REPORT: Duration = Duration::from_secs(60);
/// The most jobs read and waiting for a build thread (the oldest go first).
const PILE: usize = 4096;
/// Jobs read from the streams at once.
const READ_COUNT: usize = 256;

/// How a builder serves a queue.
#[derive(Debug, Clone)]
pub struct BuilderConfig {
    pub queue: QueueAddress,
    /// Its consumer name in the builders' group (unique on the queue).
    pub name: String,
    /// Build threads.
    pub threads: usize,
    /// Where cubins are written while they are built.
    pub workdir: PathBuf,
    /// Its own disk cache; what it compiles or finds there goes to the queue's store.
    pub cache: CubinCache,
    /// The queue's signing key: jobs without its signature are not built, and the
    /// kernels it stores carry it.
    pub seal: Option<Seal>,
}

/// What a builder did with the jobs it read.
#[derive(Debug, Default)]
pub struct BuildTally {
    /// Compiled and stored.
    pub built: AtomicUsize,
    /// Found in its own disk cache and stored.
    pub reused: AtomicUsize,
    /// Already in the store (another builder's).
    pub present: AtomicUsize,
    /// Left to the workers: taken or answered before a build thread got to it.
    pub left: AtomicUsize,
    /// Did not compile (the worker that measures it says why).
    pub failed: AtomicUsize,
    /// Not read: malformed, not signed with the queue's key, or no tuner writes it.
    pub refused: AtomicUsize,
}

impl BuildTally {
    fn add(counter: &AtomicUsize) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// One line for people.
    pub fn line(&self) -> String {
        let n = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        format!(
            "built {}, {} from its disk cache, {} already stored, {} left to the workers (taken first), {} did not compile, {} refused",
            n(&self.built),
            n(&self.reused),
            n(&self.present),
            n(&self.left),
            n(&self.failed),
            n(&self.refused)
        )
    }
}

/// What a job stream's kernels are built for: its GPU model's.
struct Target {
    arch: String,
    spec: GpuSpec,
}

/// A job to build, from the entry `entry` of `stream`.
struct Work {
    stream: String,
    entry: String,
    job: Job,
    target: Arc<Target>,
}

/// The jobs read and not built yet, newest on top. Workers take jobs from a stream's
/// oldest; a builder that took them from the oldest too would mostly be a step ahead
/// of the worker, which then waits for the kernel it wants instead of compiling another
/// (measured: the worker's own cores idle). From the newest, the two meet once per
/// round, and their builds add up.
#[derive(Default)]
struct Pile {
    jobs: Mutex<(VecDeque<Work>, bool)>,
    more: Condvar,
}

impl Pile {
    fn lock(&self) -> std::sync::MutexGuard<'_, (VecDeque<Work>, bool)> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a job; whether the oldest was dropped to make room (a worker takes it).
    fn push(&self, work: Work) -> bool {
        let mut jobs = self.lock();
        let full = jobs.0.len() >= PILE;
        if full {
            jobs.0.pop_front();
        }
        jobs.0.push_back(work);
        self.more.notify_one();
        full
    }

    /// No more jobs come.
    fn close(&self) {
        self.lock().1 = true;
        self.more.notify_all();
    }

    /// The newest job; None once closed.
    fn pop(&self) -> Option<Work> {
        let mut jobs = self.lock();
        loop {
            if let Some(work) = jobs.0.pop_back() {
                return Some(work);
            }
            if jobs.1 {
                return None;
            }
            jobs = self
                .more
                .wait_timeout(jobs, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Builds the queue's jobs into its store until `stop` is set. `notice` receives lines
/// for people.
pub fn build_for(
    cfg: BuilderConfig,
    stop: &AtomicBool,
    notice: &(dyn Fn(&str) + Sync),
) -> Result<BuildTally, QueueError> {
    let store = Arc::new(RedisCubins::new(cfg.queue.clone(), cfg.seal.clone()));
    let cache = cfg.cache.clone().with_shared(store, true);
    let counts = BuildTally::default();
    let mut con = cfg.queue.connect(READ)?;
    notice(&format!(
        "builder {}: {} build threads, building for queue {}",
        cfg.name, cfg.threads, cfg.queue
    ));
    let pile = Pile::default();
    let (cfg, cache, tally, pile) = (&cfg, &cache, &counts, &pile);
    let read = std::thread::scope(|scope| {
        for _ in 0..cfg.threads {
            scope.spawn(move || {
                gpu::compile::compile_in_background();
                let link = BestEffort::new(cfg.queue.clone());
                while let Some(work) = pile.pop() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if !waiting(&link, &work) {
                        BuildTally::add(&tally.left);
                        continue;
                    }
                    let Work { job, target, .. } = work;
                    let c = build_candidate(
                        &job.task,
                        job.state,
                        None,
                        &target.spec,
                        &target.arch,
                        &cfg.workdir,
                        Some(cache),
                    );
                    match (&c.build, c.origin) {
                        (Ok((image, _)), origin) => {
                            let _ = std::fs::remove_file(&image.cubin);
                            BuildTally::add(match origin {
                                Some(Origin::Compiled) | None => &tally.built,
                                Some(Origin::Cached) => &tally.reused,
                                Some(Origin::Shared) => &tally.present,
                            });
                        }
                        (Err(_), _) => BuildTally::add(&tally.failed),
                    }
                }
            });
        }
        let mut read = || -> Result<(), QueueError> {
            let mut targets: BTreeMap<String, Arc<Target>> = BTreeMap::new();
            let mut refreshed: Option<Instant> = None;
            let mut reported = Instant::now();
            let mut said_waiting = false;
            while !stop.load(Ordering::Relaxed) {
                if refreshed.is_none_or(|t| t.elapsed() >= REFRESH) {
                    let live = cfg.queue.retrying(
                        &mut con,
                        READ,
                        stop,
                        notice,
                        |_| Ok(()),
                        |con| registry::live(con, &cfg.queue),
                    )?;
                    for r in &live {
                        let Some(device) = r.devices.first() else {
                            continue;
                        };
                        let stream = cfg.queue.jobs(&device.name);
                        if targets.contains_key(&stream) {
                            continue;
                        }
                        let Ok(spec) = device.spec() else { continue };
                        let target = Target {
                            arch: device.arch(),
                            spec,
                        };
                        cfg.queue.retrying(
                            &mut con,
                            READ,
                            stop,
                            notice,
                            |_| Ok(()),
                            |con| ensure_group_named(con, &stream, BUILDERS),
                        )?;
                        notice(&format!(
                            "builder {}: building for {} ({})",
                            cfg.name, device.name, target.arch
                        ));
                        targets.insert(stream, Arc::new(target));
                    }
                    refreshed = Some(Instant::now());
                }
                if targets.is_empty() {
                    if !said_waiting {
                        notice(&format!(
                            "builder {}: waiting for a GPU worker on queue {}",
                            cfg.name, cfg.queue
                        ));
                        said_waiting = true;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                    continue;
                }
                if reported.elapsed() >= REPORT {
                    notice(&format!("builder {}: {}", cfg.name, tally.line()));
                    reported = Instant::now();
                }
                let streams: Vec<&String> = targets.keys().collect();
                let after = vec![">"; streams.len()];
                let options = StreamReadOptions::default()
                    .group(BUILDERS, &cfg.name)
                    .count(READ_COUNT)
                    .block(500)
                    .noack();
                // After Redis lost its data, the groups are made again.
                let regroup = |con: &mut redis::Connection| {
                    streams
                        .iter()
                        .try_for_each(|s| ensure_group_named(con, s, BUILDERS))
                };
                let read: Option<StreamReadReply> =
                    cfg.queue
                        .retrying(&mut con, READ, stop, notice, regroup, |con| {
                            Ok(con.xread_options(&streams, &after, &options)?)
                        })?;
                for key in read.into_iter().flat_map(|r| r.keys) {
                    let Some(target) = targets.get(&key.key) else {
                        continue;
                    };
                    for entry in key.ids {
                        let job = read_job(cfg.seal.as_ref(), &entry)
                            .and_then(|(job, _, _)| check_job(&job).map(|()| job));
                        let job = match job {
                            Ok(job) if job.injected.is_none() => job,
                            Ok(_) => continue, // a test's fault: the worker builds it
                            Err(why) => {
                                notice(&format!("job {} not built: {why}", entry.id));
                                BuildTally::add(&tally.refused);
                                continue;
                            }
                        };
                        let work = Work {
                            stream: key.key.clone(),
                            entry: entry.id.clone(),
                            job,
                            target: Arc::clone(target),
                        };
                        if pile.push(work) {
                            BuildTally::add(&tally.left);
                        }
                    }
                }
            }
            Ok(())
        };
        let read = read();
        pile.close();
        read
    });
    notice(&format!("builder {}: {}", cfg.name, counts.line()));
    read.map(|()| counts)
}

/// Whether `work`'s job still waits for a worker: its entry is there and in no worker's
/// pending list. When Redis does not answer, it is built anyway.
fn waiting(link: &BestEffort, work: &Work) -> bool {
    let answer = link.with(|con| {
        redis::pipe()
            .xrange_count(&work.stream, &work.entry, &work.entry, 1)
            .cmd("XPENDING")
            .arg(&work.stream)
            .arg(GROUP)
            .arg(&work.entry)
            .arg(&work.entry)
            .arg(1)
            .query::<(StreamRangeReply, StreamPendingCountReply)>(con)
    });
    answer.is_none_or(|(range, pending)| !range.ids.is_empty() && pending.ids.is_empty())
}
