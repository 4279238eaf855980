//! One writer per tuning log and per deploy cache: a run holds an exclusive advisory
//! lock (`flock`) on the log file, or on the cache's directory, from before it reads
//! until it exits. Two `tune` processes on one log would both count trials and both
//! measure on one GPU; the second is refused in one line naming the holder's PID
//! (looked up in `/proc/locks`). The kernel drops the lock with its holder however it
//! ends, so a killed run never leaves a stale lock behind.

use anyhow::{Result, bail};
use std::fs::{File, TryLockError};
use std::path::Path;

/// An exclusive lock, held until dropped.
pub struct Exclusive {
    _file: File,
}

/// Locks `path` (a file or a directory) for this process; `what` names it for the
/// message (e.g. "tuning log").
pub fn exclusive(path: &Path, what: &str) -> Result<Exclusive> {
    let file = File::open(path)
        .map_err(|e| anyhow::anyhow!("cannot open {what} {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Exclusive { _file: file }),
        Err(TryLockError::WouldBlock) => {
            let holder = holder(&file).map_or("another process".to_string(), |pid| {
                format!("another tilesched process (PID {pid})")
            });
            bail!(
                "{what} {} is in use by {holder}: one run writes it at a time",
                path.display()
            )
        }
        Err(TryLockError::Error(e)) => bail!("cannot lock {what} {}: {e}", path.display()),
    }
}

/// The PID holding a `flock` on `file`'s inode, from `/proc/locks` (lines like
/// `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF`).
fn holder(file: &File) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let inode = file.metadata().ok()?.ino();
    let me = std::process::id();
    std::fs::read_to_string("/proc/locks")
        .ok()?
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let pid = fields.get(4)?.parse::<u32>().ok()?;
            let ino = fields.get(5)?.rsplit(':').next()?.parse::<u64>().ok()?;
            (fields.get(1) == Some(&"FLOCK") && ino == inode && pid != me).then_some(pid)
        })
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_while_the_first_is_held_and_free_after() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.jsonl");
        std::fs::write(&log, "").unwrap();
        let first = exclusive(&log, "tuning log").unwrap();
        // Another open file description conflicts like another process would.
        let e = exclusive(&log, "tuning log").err().unwrap().to_string();
        assert!(e.contains("is in use by") && e.contains("log.jsonl"), "{e}");
        drop(first);
        // Free once no process holds the file: a child another test is starting may
        // hold a copy of the descriptor until its exec closes it, for a moment.
        let again = (0..200).find_map(|_| {
            let lock = exclusive(&log, "tuning log").ok();
            if lock.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            lock
        });
        assert!(
            again.is_some(),
            "the log stayed locked after its holder went"
        );
        // Directories (deploy caches) lock the same way.
        let _cache = exclusive(dir.path(), "deploy cache").unwrap();
        assert!(exclusive(dir.path(), "deploy cache").is_err());
    }
}
