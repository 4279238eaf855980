//! The interpreter's split-K through scratch (`Stmt::LastArrival`): partial sums in
//! workspace slots, published by arrivals, read by a tile's last arrival.

use super::*;

impl Block<'_> {
    /// The workspace partial sum `at` names for thread `t`, in bounds.
    pub(super) fn partial_index(&self, at: &Expr, t: usize) -> Result<usize, InterpError> {
        let index = self.eval(at, t);
        let len = self.workspace.partials.len();
        usize::try_from(index)
            .ok()
            .filter(|&i| i < len)
            .ok_or(InterpError::OutOfBounds {
                block: self.index,
                thread: t,
                tensor: "workspace",
                index,
                len,
            })
    }

    /// `Stmt::LastArrival`: each active warp (whole) publishes its partial sums to
    /// semaphore `counter` and adds its `weight`; the threads of the warp that brings it
    /// to `arrivals` reset it and run `body`.
    pub(super) fn last_arrival(
        &mut self,
        (counter, arrivals, weight_expr): (&Expr, u32, &Expr),
        active: &[bool],
        body: &[Stmt],
        (inputs, out, writes): (&Inputs, &mut [f32], &mut [u32]),
    ) -> Result<(), InterpError> {
        let mut last = vec![false; self.threads];
        let warps = whole_groups(active, 32).map_err(|warp| InterpError::PartialWarp {
            block: self.index,
            warp,
        })?;
        for w in warps {
            let t0 = w * 32;
            let c = self.eval(counter, t0);
            let weight = self.eval(weight_expr, t0);
            if weight <= 0 || (t0..t0 + 32).any(|t| self.eval(weight_expr, t) != weight) {
                return Err(InterpError::ArrivalWeight {
                    block: self.index,
                    warp: w,
                    weight,
                });
            }
            let len = self.workspace.semaphores.len();
            let c =
                usize::try_from(c)
                    .ok()
                    .filter(|&c| c < len)
                    .ok_or(InterpError::OutOfBounds {
                        block: self.index,
                        thread: t0,
                        tensor: "semaphores",
                        index: c,
                        len,
                    })?;
            let ws = &mut self.workspace;
            for i in ws.unpublished.remove(&(self.index, w)).unwrap_or_default() {
                if let Some(p) = &mut ws.partials[i] {
                    p.unpublished = p.unpublished.saturating_sub(1);
                    p.published = Some(c);
                }
            }
            ws.semaphores[c] += weight as u32;
            if ws.semaphores[c] == arrivals {
                ws.semaphores[c] = 0;
                last[t0..t0 + 32].fill(true);
                self.acquired[t0..t0 + 32].fill(Some(c));
            }
        }
        if last.contains(&true) {
            self.exec(body, &last, inputs, out, writes)?;
        }
        for (t, l) in last.iter().enumerate() {
            if *l {
                self.acquired[t] = None;
            }
        }
        Ok(())
    }
}
