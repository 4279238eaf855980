//! A measurement queue on Redis streams, so that one tuner measures on the GPUs of many
//! hosts. The tuner (`Remote`, a `measure::Measurer`) publishes each candidate as a job
//! on a stream per GPU model; `tilesched worker --queue` on each GPU host (`serve`)
//! reads jobs as a member of the stream's consumer group, builds and measures them with
//! the same local pipeline as `tune` (`measure::Local`), and posts each result to the
//! tuner's own result stream before acknowledging the job. Redis does the bookkeeping
//! a queue needs: the pending-entries list holds every job taken and not yet
//! acknowledged; a worker renews the jobs it holds while it works on them; a job whose
//! worker died (its lease ran out) is taken over by another worker with `XAUTOCLAIM`,
//! once — after a second death it is answered as an `environment` failure. A result for
//! a job already answered is ignored by the tuner, so nothing is lost or recorded twice.
//! Workers register their GPUs; a tuner measures on the model of the workers it finds
//! (or the one it names), and a worker of another model never sees its jobs.

mod address;
mod builder;
mod cubins;
mod registry;
mod remote;
pub mod seal;
mod worker;

pub use address::{PASSWORD_ENV, QueueAddress, USER_ENV};
pub use builder::{BuildTally, BuilderConfig, build_for};
pub use cubins::RedisCubins;
pub use registry::Registration;
pub use remote::Remote;
pub use seal::{Seal, SealError};
pub use worker::{WorkerConfig, host_name, serve};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum QueueError {
    #[error("--queue {given}: {why} (expected redis[s]://HOST[:PORT]/NAME)")]
    Address { given: String, why: &'static str },
    #[error(
        "queue {queue} is on another host with {missing}: anyone who reaches its port could read the jobs and have the workers build and run kernels of their own; give both, or pass --insecure"
    )]
    Exposed { queue: String, missing: String },
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("Redis at {server} refused this client: {why}")]
    Refused { server: String, why: String },
    #[error("cannot read {path}, the CA certificate for {server} (TILESCHED_REDIS_CA): {error}")]
    Ca {
        server: String,
        path: String,
        error: std::io::Error,
    },
    #[error("cannot reach Redis at {server}: {error}")]
    Connect {
        server: String,
        error: redis::RedisError,
    },
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("no worker with {wanted} registered on queue {queue} within {waited_s} s{seen}")]
    NoWorker {
        queue: String,
        wanted: String,
        waited_s: u64,
        seen: String,
    },
    #[error("workers on queue {queue} have different GPUs ({models}): name one with --queue-gpu")]
    MixedGpus { queue: String, models: String },
    #[error("a message on the queue is not what tilesched writes: {0}")]
    Message(String),
    #[error(transparent)]
    Local(#[from] measure::LocalError),
    /// Measuring stopped (a GPU whose worker process cannot be restarted).
    #[error("{0}")]
    Measure(measure::MeasureError),
}

/// The first error of the threads of one serve, which sets `stop` so the others end.
pub(crate) struct FirstError<'a> {
    stop: &'a std::sync::atomic::AtomicBool,
    error: std::sync::Mutex<Option<QueueError>>,
}

impl<'a> FirstError<'a> {
    pub(crate) fn new(stop: &'a std::sync::atomic::AtomicBool) -> FirstError<'a> {
        FirstError {
            stop,
            error: std::sync::Mutex::new(None),
        }
    }

    /// Keeps `e` unless an error came first, and stops the others.
    pub(crate) fn fail(&self, e: QueueError) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
    }

    pub(crate) fn into_inner(self) -> Option<QueueError> {
        self.error.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}
