//! The queue's store of compiled kernels: the cubin cache's shared tier
//! (`gpu::SharedCubins`) on the Redis server. Builders (`tilesched builder`, CPU-only
//! hosts) put the kernels of the jobs waiting on the queue; GPU workers look there
//! before they run NVRTC, so that a host's GPUs are not limited to its own cores'
//! builds.
//!
//! An entry is a hash (`cubin`, `log`, and with the queue's key `sig`: the HMAC of the
//! entry's name, the cubin's SHA-256 and the log) that expires 10 minutes after it was
//! put: a run's kernels are wanted while it runs. While a builder compiles a kernel it
//! holds a claim on it (a key that expires after 10 s), and a worker that wants the
//! kernel meanwhile waits for the entry rather than compile it a second time: a
//! builder is rarely far ahead of the worker that takes the same jobs. A cubin is code the GPU runs, so with
//! a key an entry is used only when its signature checks out; without one (a Redis on
//! the same host) as it is, as jobs are. The store never holds up a build: when Redis
//! cannot be reached it answers nothing for a few seconds, and the kernel is compiled
//! where it is needed.

use crate::address::QueueAddress;
use crate::seal::{self, Seal};
use gpu::SharedCubins;
use sha2::{Digest, Sha256};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long an entry lives after it was put.
const ENTRY_TTL_MS: i64 = 10 * 60 * 1000;
/// The longest wait for Redis on a lookup: a build costs a few hundred milliseconds.
const REPLY: Duration = Duration::from_secs(2);
/// After Redis failed to answer, how long lookups answer nothing without trying it.
const PAUSE: Duration = Duration::from_secs(5);
/// How long a claim lives: longer than a build takes, short enough that a builder that
/// died holds nobody up for long.
const CLAIM_MS: u64 = 10_000;
/// How often a claimed entry is looked for.
const POLL: Duration = Duration::from_millis(20);

/// A connection for what Redis only speeds up (the store, a builder's look at a job):
/// made when first needed, dropped when it fails, and not tried again for a pause, so
/// that an unreachable server costs a build nothing but the first try.
pub(crate) struct BestEffort {
    queue: QueueAddress,
    link: Mutex<(Option<redis::Connection>, Option<Instant>)>,
}

impl BestEffort {
    pub(crate) fn new(queue: QueueAddress) -> BestEffort {
        BestEffort {
            queue,
            link: Mutex::new((None, None)),
        }
    }

    /// `f` on the connection; None (and a pause) when Redis does not answer.
    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Option<T> {
        let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
        let (con, paused_until) = &mut *link;
        if con.is_none() {
            if paused_until.is_some_and(|t| Instant::now() < t) {
                return None;
            }
            *con = self.queue.connect(REPLY).ok();
        }
        let answer = con.as_mut().map(f);
        if let Some(Ok(v)) = answer {
            return Some(v);
        }
        *con = None;
        *paused_until = Some(Instant::now() + PAUSE);
        None
    }
}

/// The shared tier on the queue's Redis server.
pub struct RedisCubins {
    seal: Option<Seal>,
    link: BestEffort,
    queue: QueueAddress,
    /// Entries found and not used: not signed with the queue's key.
    refused: AtomicUsize,
}

impl RedisCubins {
    pub fn new(queue: QueueAddress, seal: Option<Seal>) -> RedisCubins {
        RedisCubins {
            seal,
            link: BestEffort::new(queue.clone()),
            queue,
            refused: AtomicUsize::new(0),
        }
    }

    /// How many entries were found and not used (not signed with the queue's key).
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::Relaxed)
    }

    /// What the signature of an entry covers.
    fn signed_parts(key: &str, cubin: &[u8], log: &str) -> [String; 4] {
        let digest: String = Sha256::digest(cubin)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        [
            "cubin".to_string(),
            key.to_string(),
            digest,
            log.to_string(),
        ]
    }

    fn sign(&self, key: &str, cubin: &[u8], log: &str) -> Option<String> {
        let parts = Self::signed_parts(key, cubin, log);
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        self.seal.as_ref().map(|s| s.sign(&parts))
    }

    /// Whether an entry read back may be used: signed with the queue's key, where there
    /// is one.
    fn trusted(&self, key: &str, cubin: &[u8], log: &str, sig: Option<&str>) -> bool {
        let Some(seal) = &self.seal else {
            return true;
        };
        let parts = Self::signed_parts(key, cubin, log);
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        seal.verify(&parts, sig).is_ok()
    }
}

impl SharedCubins for RedisCubins {
    fn get(&self, key: &str) -> Option<(Vec<u8>, String)> {
        let (name, claim) = (self.queue.cubin(key), self.queue.cubin_claim(key));
        type Entry = (Option<Vec<u8>>, Option<String>, Option<String>);
        let (cubin, log, sig) = loop {
            let ((cubin, log, sig), claimed): (Entry, bool) = self.link.with(|con| {
                redis::pipe()
                    .cmd("HMGET")
                    .arg(&name)
                    .arg("cubin")
                    .arg("log")
                    .arg(seal::FIELD)
                    .exists(&claim)
                    .query(con)
            })?;
            match (cubin, log) {
                (Some(cubin), Some(log)) => break (cubin, log, sig),
                // Being compiled elsewhere: the claim ends with the entry, or expires.
                _ if claimed => std::thread::sleep(POLL),
                _ => return None,
            }
        };
        if self.trusted(key, &cubin, &log, sig.as_deref()) {
            Some((cubin, log))
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    fn put(&self, key: &str, cubin: &[u8], log: &str) {
        let name = self.queue.cubin(key);
        let sig = self.sign(key, cubin, log);
        self.link.with(|con| {
            let mut pipe = redis::pipe();
            pipe.atomic()
                .hset(&name, "cubin", cubin)
                .ignore()
                .hset(&name, "log", log)
                .ignore();
            match &sig {
                Some(sig) => pipe.hset(&name, seal::FIELD, sig).ignore(),
                None => pipe.hdel(&name, seal::FIELD).ignore(),
            };
            pipe.pexpire(&name, ENTRY_TTL_MS)
                .ignore()
                .del(self.queue.cubin_claim(key))
                .ignore()
                .query::<()>(con)
        });
    }

    fn claim(&self, key: &str) {
        let claim = self.queue.cubin_claim(key);
        self.link.with(|con| {
            redis::cmd("SET")
                .arg(&claim)
                .arg(1)
                .arg("PX")
                .arg(CLAIM_MS)
                .query::<()>(con)
        });
    }

    fn release(&self, key: &str) {
        let claim = self.queue.cubin_claim(key);
        self.link
            .with(|con| redis::cmd("DEL").arg(&claim).query::<()>(con));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(key: Option<&[u8]>) -> RedisCubins {
        let queue: QueueAddress = "redis://127.0.0.1:1/test".parse().unwrap();
        RedisCubins::new(queue, key.map(|k| Seal::new(k).unwrap()))
    }

    #[test]
    fn an_entry_is_used_only_with_the_queue_s_signature() {
        let signed = store(Some(b"a key of sixteen bytes"));
        let (key, cubin, log) = ("ab12", b"\x7fELF code".as_slice(), "ptxas info");
        let sig = signed.sign(key, cubin, log).unwrap();
        assert!(signed.trusted(key, cubin, log, Some(&sig)));
        assert!(!signed.trusted(key, cubin, log, None));
        assert!(!signed.trusted(key, b"\x7fELF c0de", log, Some(&sig)));
        assert!(!signed.trusted(key, cubin, "ptxas inf0", Some(&sig)));
        assert!(!signed.trusted("ab13", cubin, log, Some(&sig)));
        let other = store(Some(b"another sixteen bytes"));
        assert!(!other.trusted(key, cubin, log, Some(&sig)));
        // Without a key (a Redis on this host) entries are taken as they are.
        assert!(store(None).trusted(key, cubin, log, None));
        assert_eq!(store(None).sign(key, cubin, log), None);
    }

    #[test]
    fn an_unreachable_server_answers_nothing_and_is_not_asked_again_at_once() {
        let s = store(None);
        let started = Instant::now();
        assert_eq!(s.get("ab12"), None);
        s.put("ab12", b"\x7fELF", "log");
        assert_eq!(s.get("ab12"), None);
        // One failed connection, then the pause: no further tries.
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(s.link.link.lock().unwrap().1.is_some());
    }
}
