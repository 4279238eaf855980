//! The interpreter's warpgroup MMAs (`wgmma`): whole warpgroups only, operands read
//! where their descriptors say, results pending until their group retires.

use super::*;

impl Block<'_> {
    /// The warpgroups of thread `t`'s block.
    pub(super) fn own_warpgroups(&self, t: usize) -> std::ops::Range<usize> {
        if self.cluster == 1 {
            return 0..self.warpgroups.committed.len();
        }
        let per_block = self.stride / WARPGROUP;
        let first = self.rank(t) * per_block;
        first..first + per_block
    }

    /// The warpgroups that run a warpgroup instruction: those with an active thread,
    /// which must be active whole.
    pub(super) fn warpgroups_of(&self, active: &[bool]) -> Result<Vec<usize>, InterpError> {
        whole_groups(active, WARPGROUP).map_err(|warpgroup| InterpError::PartialWarpgroup {
            block: self.index,
            warpgroup,
        })
    }

    /// Operand element (`mn`, `k`) of a warpgroup MMA read by warpgroup `w` through
    /// `operand`'s descriptor: where the hardware finds it (the canonical layout, then
    /// the swizzle of the address), readable only if TMA wrote it in a phase every
    /// thread of the warpgroup waited for. The read is recorded against the group the
    /// MMA joins.
    pub(super) fn operand(
        &mut self,
        w: usize,
        operand: &WgmmaOperand,
        (mn, k): (i64, i64),
        group: u64,
    ) -> Result<f32, InterpError> {
        let leader = w * WARPGROUP;
        let bytes = self.eval(&operand.start, leader) + operand.layout.offset(mn, k);
        let index = swizzle_address(bytes, operand.layout.swizzle) / operand.layout.element_bytes;
        let (block, tile) = (self.index, operand.input);
        let at = self.cell_index(tile, self.rank(leader), index);
        let cell = at
            .and_then(|i| self.tiles[tile].get(i))
            .copied()
            .ok_or(InterpError::Uninitialized { block, tile, index })?;
        let Some((barrier, phase)) = cell.landed_in else {
            return Err(InterpError::WgmmaOperand { block, tile, index });
        };
        if (leader..leader + WARPGROUP).any(|t| !self.barriers[barrier].observed(t, phase)) {
            return Err(InterpError::TmaPending { block, tile, index });
        }
        self.tiles[tile][at.unwrap_or_default()].wgmma_read = Some((w, group));
        Ok(cell.value)
    }

    /// Warpgroup `w`'s MMA into accumulators `acc..acc + n/2` of each of its threads.
    pub(super) fn wgmma(
        &mut self,
        w: usize,
        (acc, n): (i64, i64),
        [a, b]: [&WgmmaOperand; 2],
    ) -> Result<(), InterpError> {
        let leader = w * WARPGROUP;
        if (leader..leader + WARPGROUP).any(|t| self.warpgroups.unfenced[t]) {
            return Err(InterpError::MissingFence {
                block: self.index,
                warpgroup: w,
            });
        }
        let group = self.warpgroups.committed[w];
        let atom = WgmmaAtom::for_dtype(self.kernel.dtype).unwrap_or(&FP16_M64K16);
        let (m, k) = (atom.m, atom.k);
        let mut av = vec![0.0; (m * k) as usize];
        for r in 0..m {
            for x in 0..k {
                av[(r * k + x) as usize] = self.operand(w, a, (r, x), group)?;
            }
        }
        let mut bv = vec![0.0; (k * n) as usize];
        for x in 0..k {
            for c in 0..n {
                bv[(x * n + c) as usize] = self.operand(w, b, (c, x), group)?;
            }
        }
        let layout = WgmmaAtom::accumulator(n);
        for t in leader..leader + WARPGROUP {
            for v in 0..layout.values {
                let (r, c) = layout.coord((t - leader) as i64, v);
                let i = self.acc_slot(&Expr::Const(acc + v), t)?;
                let mut sum = self.acc[t][i];
                for x in 0..k {
                    sum = av[(r * k + x) as usize].mul_add(bv[(x * n + c) as usize], sum);
                }
                self.acc[t][i] = sum;
                self.warpgroups.pending[t][i] = Some(group);
            }
        }
        Ok(())
    }

    /// The slot of accumulator `acc` of thread `t`, which no pending MMA group may
    /// still write.
    pub(super) fn settled(&self, acc: &Expr, t: usize) -> Result<usize, InterpError> {
        let i = self.acc_slot(acc, t)?;
        if let Some(group) = self.warpgroups.pending[t][i]
            && self.warpgroups.retired[t / WARPGROUP] <= group
        {
            return Err(InterpError::AccumulatorPending {
                block: self.index,
                thread: t,
                index: i,
            });
        }
        Ok(i)
    }

    pub(super) fn acc_slot(&self, acc: &Expr, t: usize) -> Result<usize, InterpError> {
        let index = self.eval(acc, t);
        let len = self.kernel.accumulators;
        usize::try_from(index)
            .ok()
            .filter(|&i| (i as i64) < len)
            .ok_or(InterpError::Accumulator { index, len })
    }
}
