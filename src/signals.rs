//! SIGINT, SIGTERM and SIGHUP as a stop flag, for the commands that must finish what is
//! in flight before they stop: the tuner logs the measurements it waits for, a queue
//! worker answers the jobs it is measuring and hands back the rest at once. A second
//! signal still ends the process at once.

use anyhow::{Context, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// While it lives, the first SIGINT, SIGTERM or SIGHUP sets `flag`; a second one ends the
/// process at once with status 130, as an unhandled one would. The first prints one line,
/// given at registration, saying what happens now. Dropped, the signals act as before (so
/// that `pipeline`'s later stages stop on Ctrl-C as they always did).
pub struct SignalFlag {
    pub flag: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
    done: Arc<AtomicBool>,
    /// Whether the line was said (once, by the watching thread or at the drop).
    said: Arc<AtomicBool>,
    line: &'static str,
}

impl SignalFlag {
    pub fn register(line: &'static str) -> Result<SignalFlag> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let flag = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        for signal in [SIGINT, SIGTERM, SIGHUP] {
            // Registered first, so it sees the flag as the previous signal left it.
            ids.push(
                signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&flag))
                    .context("cannot handle signals")?,
            );
            ids.push(
                signal_hook::flag::register(signal, Arc::clone(&flag))
                    .context("cannot handle signals")?,
            );
        }
        let done = Arc::new(AtomicBool::new(false));
        let said = Arc::new(AtomicBool::new(false));
        let (seen, over, told) = (Arc::clone(&flag), Arc::clone(&done), Arc::clone(&said));
        std::thread::spawn(move || {
            while !over.load(Ordering::Relaxed) {
                if seen.load(Ordering::Relaxed) {
                    if !told.swap(true, Ordering::Relaxed) {
                        eprintln!("{line}");
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Ok(SignalFlag {
            flag,
            ids,
            done,
            said,
            line,
        })
    }
}

impl Drop for SignalFlag {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
        self.done.store(true, Ordering::Relaxed);
        // A stop quicker than the watching thread's next look still says its line.
        if self.flag.load(Ordering::Relaxed) && !self.said.swap(true, Ordering::Relaxed) {
            eprintln!("{}", self.line);
        }
    }
}
