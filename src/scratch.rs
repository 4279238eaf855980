//! Scratch directories of a run (the cubins `tune` builds): named after the process
//! (`tilesched-<pid>-…` in the temp directory) and removed when the run ends. A run
//! killed with `kill -9` cannot remove its own, so every start removes those whose
//! process is gone.

use anyhow::{Context, Result};
use std::path::Path;

const PREFIX: &str = "tilesched-";

/// Removes the stale scratch directories under `temp`, then creates this run's.
pub fn create() -> Result<tempfile::TempDir> {
    let temp = std::env::temp_dir();
    remove_stale(&temp);
    tempfile::Builder::new()
        .prefix(&format!("{PREFIX}{}-", std::process::id()))
        .tempdir_in(&temp)
        .context("cannot create a temporary directory for cubins")
}

/// Removes every `tilesched-<pid>-…` directory of `temp` whose process has ended.
fn remove_stale(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let gone = !Path::new(&format!("/proc/{pid}")).exists();
        if gone && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_scratch_directories_go_and_live_ones_stay() {
        let temp = tempfile::tempdir().unwrap();
        // No process has PID 4194304 + 1 (above Linux's largest PID).
        let stale = temp.path().join(format!("{PREFIX}4194305-abc"));
        let live = temp
            .path()
            .join(format!("{PREFIX}{}-abc", std::process::id()));
        let other = temp.path().join("tilesched-sass-walks-1");
        for d in [&stale, &live, &other] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("k.cubin"), b"x").unwrap();
        }
        remove_stale(temp.path());
        assert!(!stale.exists());
        assert!(live.exists() && other.exists());
    }
}
