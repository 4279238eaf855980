//! The mbarrier protocol as the interpreter runs it: a barrier counts the arrivals of
//! its current phase and the transaction bytes that phase expects (`arrive.expect_tx`)
//! against those that copies completed on it (`cp.async.bulk.tensor`); when both
//! balance, the phase completes and the next begins. A thread waits on a phase by its
//! parity, in order: waiting with the wrong parity, or for a phase that nothing can
//! complete any more (a missing arrival or `expect_tx`, a copy of other bytes), is an
//! error the GPU would show as a hang or a race. The copies that completed a phase are
//! visible to a thread once it has waited for that phase.
//!
//! A phase also carries what the arriving threads knew: each arrival may release a
//! vector of counters (the interpreter's count of each warpgroup's completed MMA
//! groups), merged by maximum, and a thread that waits for the phase learns them. This
//! is how a consumer tells the producer that a buffer is no longer read.

/// Why a wait cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitError {
    /// The barrier was never initialized.
    Uninitialized,
    /// The thread waited with parity `got` for the phase of parity `expected`.
    Parity { expected: u64, got: i64 },
    /// The phase waited for has not completed and cannot: what it has and needs.
    Deadlock {
        phase: u64,
        arrived: u32,
        arrivals: u32,
        landed: i64,
        expected: i64,
    },
}

/// One barrier of one block.
#[derive(Debug, Clone)]
pub struct Mbarrier {
    /// Arrivals per phase; None until `mbarrier.init`.
    arrivals: Option<u32>,
    arrived: u32,
    /// Transaction bytes the phase in progress expects, and those that landed.
    expected: i64,
    landed: i64,
    /// Phases completed: the one in progress is `completed`.
    completed: u64,
    /// Per thread, the phases it has waited for.
    observed: Vec<u64>,
    /// What the arrivals of the phase in progress released, and what each completed
    /// phase carried.
    carry: Vec<u64>,
    carried: Vec<Vec<u64>>,
}

impl Mbarrier {
    pub fn new(threads: usize) -> Mbarrier {
        Mbarrier {
            arrivals: None,
            arrived: 0,
            expected: 0,
            landed: 0,
            completed: 0,
            observed: vec![0; threads],
            carry: Vec::new(),
            carried: Vec::new(),
        }
    }

    pub fn init(&mut self, arrivals: u32) {
        *self = Mbarrier {
            arrivals: Some(arrivals),
            ..Mbarrier::new(self.observed.len())
        };
    }

    pub fn initialized(&self) -> bool {
        self.arrivals.is_some()
    }

    /// The phase in progress, which copies completing on the barrier now belong to.
    pub fn phase(&self) -> u64 {
        self.completed
    }

    /// One arrival that also expects `bytes` from copies.
    pub fn arrive(&mut self, bytes: i64) {
        self.arrived += 1;
        self.expected += bytes;
        self.settle();
    }

    /// A copy of `bytes` completed on the barrier.
    pub fn land(&mut self, bytes: i64) {
        self.landed += bytes;
        self.settle();
    }

    /// Merges `knowledge` into what the phase in progress carries.
    pub fn release(&mut self, knowledge: &[u64]) {
        if self.carry.len() < knowledge.len() {
            self.carry.resize(knowledge.len(), 0);
        }
        for (c, k) in self.carry.iter_mut().zip(knowledge) {
            *c = (*c).max(*k);
        }
    }

    /// What completed phase `phase` carried.
    pub fn carried(&self, phase: u64) -> &[u64] {
        self.carried.get(phase as usize).map_or(&[], Vec::as_slice)
    }

    fn settle(&mut self) {
        if self.arrivals == Some(self.arrived) && self.landed == self.expected {
            self.carried.push(std::mem::take(&mut self.carry));
            self.completed += 1;
            self.arrived = 0;
            self.expected = 0;
            self.landed = 0;
        }
    }

    /// Thread `t` waits for its next phase, which must have parity `parity`; returns
    /// that phase.
    pub fn wait(&mut self, t: usize, parity: i64) -> Result<u64, WaitError> {
        let Some(arrivals) = self.arrivals else {
            return Err(WaitError::Uninitialized);
        };
        let next = self.observed[t];
        if i64::try_from(next % 2) != Ok(parity) {
            return Err(WaitError::Parity {
                expected: next % 2,
                got: parity,
            });
        }
        if self.completed <= next {
            return Err(WaitError::Deadlock {
                phase: next,
                arrived: self.arrived,
                arrivals,
                landed: self.landed,
                expected: self.expected,
            });
        }
        self.observed[t] = next + 1;
        Ok(next)
    }

    /// Whether thread `t`'s next wait would return now: its next phase completed.
    pub fn ready(&self, t: usize) -> bool {
        self.arrivals.is_some() && self.completed > self.observed[t]
    }

    /// Whether thread `t` has waited for phase `phase`.
    pub fn observed(&self, t: usize, phase: u64) -> bool {
        self.observed[t] > phase
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_carries_what_its_arrivals_released() {
        let mut b = Mbarrier::new(1);
        b.init(2);
        b.release(&[3, 0]);
        b.arrive(0);
        b.release(&[1, 5]);
        b.arrive(0);
        b.release(&[9]);
        assert_eq!(b.wait(0, 0), Ok(0));
        assert_eq!(b.carried(0), &[3, 5]);
        assert_eq!(
            b.carried(1),
            &[] as &[u64],
            "the phase in progress carries nothing yet"
        );
    }

    #[test]
    fn a_phase_completes_when_arrivals_and_bytes_balance_in_either_order() {
        let mut b = Mbarrier::new(2);
        b.init(1);
        b.land(64);
        assert_eq!(b.phase(), 0, "bytes without the arrival");
        b.arrive(64);
        assert_eq!(b.phase(), 1);
        b.arrive(32);
        b.land(32);
        assert_eq!(b.phase(), 2);
        assert!(!b.observed(0, 0));
        assert_eq!(b.wait(0, 0), Ok(0));
        assert_eq!(b.wait(0, 1), Ok(1));
        assert!(b.observed(0, 1) && !b.observed(1, 0));
    }

    #[test]
    fn waits_go_in_parity_order_and_a_phase_short_of_bytes_deadlocks() {
        let mut b = Mbarrier::new(1);
        assert_eq!(b.wait(0, 0), Err(WaitError::Uninitialized));
        b.init(1);
        assert_eq!(
            b.wait(0, 1),
            Err(WaitError::Parity {
                expected: 0,
                got: 1
            })
        );
        b.arrive(64);
        b.land(32);
        assert_eq!(
            b.wait(0, 0),
            Err(WaitError::Deadlock {
                phase: 0,
                arrived: 1,
                arrivals: 1,
                landed: 32,
                expected: 64
            })
        );
    }
}
