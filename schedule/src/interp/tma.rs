//! The interpreter's mbarriers and TMA: barriers by address (also another block's of the
//! cluster), their initialization, and TMA copies in and out of shared memory that land
//! when their barrier's phase completes.

use super::*;

impl Block<'_> {
    /// The mbarrier that `barrier` names for thread `t`, of its own block.
    pub(super) fn barrier(&self, barrier: &Expr, t: usize) -> Result<usize, InterpError> {
        self.barrier_of(barrier, t, self.rank(t))
    }

    /// The mbarrier that `barrier` names for thread `t`, of the cluster's block `rank`:
    /// one its own block has, and, of another block, one published to the cluster.
    pub(super) fn barrier_of(
        &self,
        barrier: &Expr,
        t: usize,
        rank: usize,
    ) -> Result<usize, InterpError> {
        let b = self.eval(barrier, t);
        let count = self.barriers.len() / self.cluster;
        let local =
            usize::try_from(b)
                .ok()
                .filter(|&b| b < count)
                .ok_or(InterpError::MbarrierIndex {
                    block: self.index,
                    barrier: b,
                    count,
                })?;
        let at = rank * count + local;
        if rank != self.rank(t) && !self.published[at] {
            return Err(InterpError::MbarrierRemote {
                block: self.index,
                barrier: local,
            });
        }
        Ok(at)
    }

    /// The blocks of the cluster that thread `t`'s copy lands in or its arrival
    /// reaches: those `ranks` names, else its own.
    pub(super) fn destinations(
        &self,
        t: usize,
        ranks: Option<&Ranks>,
    ) -> Result<Vec<usize>, InterpError> {
        let Some(ranks) = ranks else {
            return Ok(vec![self.rank(t)]);
        };
        let all = ranks.of(self.eval(&ranks.first, t));
        match all.iter().find(|&&r| r >= self.cluster) {
            Some(&rank) => Err(InterpError::ClusterRank {
                block: self.index,
                rank,
                cluster: self.cluster,
            }),
            None => Ok(all),
        }
    }

    pub(super) fn initialized(&self, barrier: usize) -> Result<(), InterpError> {
        if self.barriers[barrier].initialized() {
            Ok(())
        } else {
            Err(InterpError::MbarrierUninitialized {
                block: self.index,
                barrier,
            })
        }
    }

    /// Thread `t`'s TMA copy of the box of tensor map `params[map]` at `coords` into its
    /// input's tile from element `at`, as the box lays itself out (zeros outside the
    /// tensor), completing its bytes on `barrier` in the phase in progress.
    pub(super) fn tma_load(
        &mut self,
        map: usize,
        coords: &[Expr],
        (at, rank): (&Expr, usize),
        barrier: usize,
        t: usize,
        inputs: &Inputs,
    ) -> Result<(), InterpError> {
        let (_, input, tensor) = self.kernel.tensor_map(map);
        let tensor = tensor.clone();
        let origin: Vec<i64> = coords.iter().map(|c| self.eval(c, t)).collect();
        if let Some(problem) = tensor.origin_error(&origin) {
            return Err(InterpError::TmaOrigin {
                block: self.index,
                thread: t,
                origin,
                problem,
            });
        }
        let base = self.eval(at, t);
        let phase = self.barriers[barrier].phase();
        for (offset, global) in tensor.elements(&origin) {
            let value = match global {
                Some(g) => self.read_global(inputs, input, g, t)?,
                None => 0.0,
            };
            let cell = self.write_shared((input, rank, base + offset), t, value)?;
            self.tiles[input][cell].landed_in = Some((barrier, phase));
        }
        self.barriers[barrier].land(tensor.box_bytes() as i64);
        Ok(())
    }

    /// Thread `t`'s TMA store of the box of the output's tensor map `params[map]` at
    /// `coords` from the staging buffers at element `from`, as the box lays itself out:
    /// the elements inside the tensor are written.
    pub(super) fn tma_store(
        &mut self,
        map: usize,
        coords: &[Expr],
        from: &Expr,
        t: usize,
        (out, writes): (&mut [f32], &mut [u32]),
    ) -> Result<(), InterpError> {
        let (_, _, tensor) = self.kernel.tensor_map(map);
        let origin: Vec<i64> = coords.iter().map(|c| self.eval(c, t)).collect();
        let len = self.kernel.staging.map_or(0, |s| s.elements);
        let base = self.rank(t) as i64 * len + self.eval(from, t);
        for (offset, global) in tensor.elements(&origin) {
            let Some(global) = global else {
                continue;
            };
            let value = self
                .staging
                .read(t, base + offset)
                .map_err(staging_error(self.index))?;
            let o = usize::try_from(global)
                .ok()
                .filter(|&o| o < out.len())
                .ok_or(InterpError::OutOfBounds {
                    block: self.index,
                    thread: t,
                    tensor: "out",
                    index: global,
                    len: out.len(),
                })?;
            out[o] = value;
            writes[o] += 1;
        }
        self.staging.commit(t);
        Ok(())
    }

    /// Thread `t`'s `cp.async` of `value` to a shared cell: a write now (for the race
    /// check), readable once it lands.
    pub(super) fn write_async(
        &mut self,
        tile: usize,
        index: i64,
        t: usize,
        value: f32,
    ) -> Result<(), InterpError> {
        let at = self.write_shared((tile, self.rank(t), index), t, value)?;
        let cell = &mut self.tiles[tile][at];
        cell.pending = true;
        cell.asynchronous = true;
        self.open_group[t].push((tile, at));
        Ok(())
    }
}
