//! Stream-K's deal of a reduction to the blocks of a grid, shared by the tensor-core
//! sketches that run it (`mma`, `wgmma`): the `I = tiles × K tiles` iterations, output
//! tile by output tile, are cut into `B` even contiguous runs, block `b` taking
//! `[b·I/B, (b+1)·I/B)`. A run may start and end inside a tile, so a tile can be shared
//! by several blocks, whose segments (the parts of a run inside one tile) meet in the
//! workspace; the lowerings deal the runs exactly so, and the features count the
//! segments from the same arithmetic.

/// Stream-K over `blocks` blocks of `tiles` output tiles of `ktiles` K tiles each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamK {
    pub blocks: u64,
    pub tiles: u64,
    pub ktiles: u64,
}

impl StreamK {
    /// Every tile's K tiles, tile by tile.
    pub fn iterations(&self) -> u64 {
        self.tiles * self.ktiles
    }

    /// The run of block `b`: its first iteration and the one past its last.
    pub fn run(&self, b: u64) -> (u64, u64) {
        let total = self.iterations();
        let blocks = self.blocks.max(1);
        (b * total / blocks, (b + 1) * total / blocks)
    }

    /// The longest run, the iterations of a block's loop.
    pub fn longest(&self) -> u64 {
        self.iterations().div_ceil(self.blocks.max(1))
    }

    /// Whether the deal is one the lowerings can run: two blocks or more, fewer blocks
    /// than iterations (so that no run is empty), and `(blocks + 1) · iterations`, the
    /// largest product the run bounds take, within 32 bits.
    pub fn valid(&self) -> bool {
        let iterations = self.iterations();
        self.blocks >= 2
            && self.blocks < iterations
            && (self.blocks + 1) * iterations <= i32::MAX as u64
    }

    /// The partial segments (a block's part of a tile that is not the whole tile, whose
    /// sums go through the workspace) and the tiles they cut.
    pub fn segments(&self) -> (u64, u64) {
        let ktiles = self.ktiles.max(1);
        let (mut partial, mut cut, mut last_cut) = (0, 0, None);
        for b in 0..self.blocks.max(1) {
            let (start, end) = self.run(b);
            for tile in start / ktiles..end.div_ceil(ktiles) {
                let from = start.max(tile * ktiles);
                let to = end.min((tile + 1) * ktiles);
                if to > from && to - from < ktiles {
                    partial += 1;
                    if last_cut != Some(tile) {
                        cut += 1;
                        last_cut = Some(tile);
                    }
                }
            }
        }
        (partial, cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_every_iteration_once() {
        for (blocks, tiles, ktiles) in [(3, 2, 5), (7, 4, 3), (132, 16, 72), (5, 5, 1)] {
            let s = StreamK {
                blocks,
                tiles,
                ktiles,
            };
            let mut next = 0;
            for b in 0..blocks {
                let (start, end) = s.run(b);
                assert_eq!(start, next);
                assert!(end - start <= s.longest());
                next = end;
            }
            assert_eq!(next, s.iterations());
        }
    }

    #[test]
    fn segments_count_the_cuts() {
        // Two tiles of 4 K tiles over 3 blocks: runs [0,2) [2,5) [5,8) cut both tiles
        // into 2 and (1 + 3) partial segments.
        let s = StreamK {
            blocks: 3,
            tiles: 2,
            ktiles: 4,
        };
        assert_eq!(s.segments(), (4, 2));
        // Runs of whole tiles cut nothing.
        let whole = StreamK {
            blocks: 2,
            tiles: 4,
            ktiles: 3,
        };
        assert_eq!(whole.segments(), (0, 0));
    }

    #[test]
    fn validity_bounds_blocks_and_indices() {
        let s = |blocks| StreamK {
            blocks,
            tiles: 4,
            ktiles: 8,
        };
        assert!(!s(1).valid());
        assert!(s(2).valid());
        assert!(s(31).valid());
        assert!(!s(32).valid());
    }
}
