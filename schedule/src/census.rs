//! What one thread of a block issues, counted from a lowered kernel's IR: the
//! statements of each kind, every loop at its full extent and every guarded body as
//! taken. Guards skip tails, and pipeline tiles past a block's last, so the census is
//! what the block with every tile and every copy issues: the per-thread upper bound that
//! the analytical features describe. The feature tests hold the tensor-core features'
//! instruction counts (`mma.sync`, fragment loads, `cp.async` copies) to this census of
//! the kernel that lowering actually generates.

use crate::ir::Stmt;

/// Statements one thread issues, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// `mma.sync` instructions.
    pub mma: u64,
    /// Fragment loads per input: one `ldmatrix` each (or, for TF32 with an N-major B,
    /// one group of 32-bit shared loads).
    pub fragment_loads: [u64; 2],
    /// Fragments those loads fill per input (a load of two B fragments counts two).
    pub fragments: [u64; 2],
    /// `cp.async` copies per input.
    pub async_copies: [u64; 2],
}

impl Census {
    /// The census of `body`.
    pub fn of(body: &[Stmt]) -> Census {
        let mut census = Census::default();
        census.add(body, 1);
        census
    }

    fn add(&mut self, body: &[Stmt], times: u64) {
        for s in body {
            match s {
                Stmt::For { extent, body, .. } => {
                    self.add(body, times * u64::try_from(*extent).unwrap_or(0))
                }
                Stmt::If { body, .. } | Stmt::Block { body } => self.add(body, times),
                Stmt::Mma { .. } => self.mma += times,
                Stmt::LoadFragment { input, count, .. } => {
                    self.fragment_loads[*input] += times;
                    self.fragments[*input] += times * *count as u64;
                }
                Stmt::AsyncCopy { read, .. } => self.async_copies[read.input] += times,
                _ => {}
            }
        }
    }
}
