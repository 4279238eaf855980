//! What this process has used of the machine so far (getrusage): CPU time in user and
//! kernel mode, and page faults. The end table of `tune` prints it, because a run whose
//! builders are slow can be short of cores (user time near cores × wall) or losing them
//! to the kernel (system time, page faults), and the two call for different fixes.

use std::time::Duration;

/// This process's use so far, all threads together (not its children).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    pub user: Duration,
    pub system: Duration,
    /// Page faults served without I/O (mapping memory the process allocated).
    pub minor_faults: u64,
}

fn duration(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
}

/// This process's use so far; None where getrusage fails (it does not on Linux).
pub fn now() -> Option<Usage> {
    read(libc::RUSAGE_SELF)
}

/// The calling thread's use so far (Linux; the allocator's test counts its faults).
#[cfg(all(test, target_os = "linux"))]
pub fn this_thread() -> Option<Usage> {
    read(libc::RUSAGE_THREAD)
}

fn read(who: libc::c_int) -> Option<Usage> {
    let mut r = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `r` is a valid out-pointer to a rusage; `who` is RUSAGE_SELF or
    // RUSAGE_THREAD, both valid targets.
    let rc = unsafe { libc::getrusage(who, r.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage succeeded and filled the struct (it was zeroed before anyway).
    let r = unsafe { r.assume_init() };
    Some(Usage {
        user: duration(r.ru_utime),
        system: duration(r.ru_stime),
        minor_faults: r.ru_minflt.max(0) as u64,
    })
}

impl Usage {
    /// What was used between `earlier` and this.
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
            minor_faults: self.minor_faults.saturating_sub(earlier.minor_faults),
        }
    }

    /// The line of `tune`'s end table: the CPU this process used over `wall` on a
    /// machine of `cores`.
    pub fn line(&self, wall: Duration, cores: usize) -> String {
        let user = self.user.as_secs_f64();
        let system = self.system.as_secs_f64();
        let capacity = wall.as_secs_f64() * cores as f64;
        format!(
            "CPU of this process: user {user:.1} s, system {system:.1} s ({:.0}% of {cores} cores over the wall), {} minor page faults",
            100.0 * (user + system) / capacity.max(1e-9),
            self.minor_faults
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_shows_as_user_time() {
        let before = now().unwrap();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let after = now().unwrap();
        assert!(
            after.user >= before.user + Duration::from_millis(30),
            "{before:?} {after:?}"
        );
    }

    #[test]
    fn the_line_says_the_share_of_the_machine() {
        let u = Usage {
            user: Duration::from_secs(30),
            system: Duration::from_secs(10),
            minor_faults: 7,
        };
        assert_eq!(
            u.line(Duration::from_secs(10), 8),
            "CPU of this process: user 30.0 s, system 10.0 s (50% of 8 cores over the wall), 7 minor page faults"
        );
    }
}
