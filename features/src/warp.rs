//! Per-instruction memory costs of one warp, from the addresses of its active lanes.
//!
//! The hardware charges memory per warp instruction, not per thread: a global access
//! costs one transaction per distinct 32-byte sector its lanes touch, a shared access
//! one wavefront (cycle) per distinct 4-byte word in its most loaded bank (lanes reading
//! the same word are served by one broadcast). That is why the features simulate the 32
//! lanes of representative warps instead of counting bytes.
//!
//! Addresses here are in floats (4 bytes); each lane accesses `width` consecutive floats
//! (1, 2 or 4: scalar, 64-bit or 128-bit accesses).

/// Lanes of a warp.
pub(crate) const WARP_LANES: usize = 32;
/// Floats per 32-byte global-memory sector.
const SECTOR_FLOATS: i64 = 8;
/// The widest access a lane makes, in floats (128 bits).
pub(crate) const MAX_WIDTH: i64 = 4;
/// Most banks a shared memory has (32 on every NVIDIA GPU so far).
const MAX_BANKS: usize = 64;

/// The first float each active lane of one warp instruction accesses.
#[derive(Debug, Clone)]
pub(crate) struct WarpAccess {
    starts: [i64; WARP_LANES],
    len: usize,
}

impl WarpAccess {
    pub(crate) fn new() -> Self {
        WarpAccess {
            starts: [0; WARP_LANES],
            len: 0,
        }
    }

    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Adds a lane; lanes beyond 32 are ignored (a warp has no more).
    pub(crate) fn push(&mut self, start: i64) {
        if self.len < WARP_LANES {
            self.starts[self.len] = start;
            self.len += 1;
        }
    }

    /// Adds `delta` to every lane's address.
    pub(crate) fn shift(&mut self, delta: i64) {
        for start in &mut self.starts[..self.len] {
            *start += delta;
        }
    }

    pub(crate) fn lanes(&self) -> usize {
        self.len
    }

    fn starts(&self) -> &[i64] {
        &self.starts[..self.len]
    }
}

/// Transactions of one instruction and what they would be without waste.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Cost {
    pub actual: u32,
    pub ideal: u32,
}

/// Global memory: distinct 32-byte sectors the lanes touch, and the fewest sectors that
/// could hold the same bytes (`ceil(lanes * width * 4 / 32)`).
pub(crate) fn sectors(access: &WarpAccess, width: i64) -> Cost {
    let width = width.clamp(1, MAX_WIDTH);
    let mut buf = [0i64; 2 * WARP_LANES];
    let mut n = 0;
    for &start in access.starts() {
        let first = start.div_euclid(SECTOR_FLOATS);
        let last = (start + width - 1).div_euclid(SECTOR_FLOATS);
        buf[n] = first;
        n += 1;
        // An aligned vector never straddles a sector; an unaligned one (an invalid
        // state) may touch two.
        if last != first {
            buf[n] = last;
            n += 1;
        }
    }
    let floats = access.lanes() as i64 * width;
    Cost {
        actual: distinct(&mut buf[..n]) as u32,
        ideal: ((floats + SECTOR_FLOATS - 1) / SECTOR_FLOATS) as u32,
    }
}

/// Shared memory: wavefronts of the instruction (the largest number of distinct words
/// in one bank; same word = broadcast) and the fewest it could take (distinct words /
/// banks, rounded up). For 64- and 128-bit accesses this equals the half- and
/// quarter-warp phase rule whenever lanes do not share addresses, and credits the
/// broadcast when they do.
pub(crate) fn wavefronts(access: &WarpAccess, width: i64, banks: u32) -> Cost {
    let width = width.clamp(1, MAX_WIDTH);
    let banks = (banks as usize).clamp(1, MAX_BANKS);
    // Distinct lane addresses first: broadcasts are common and this is the hot path.
    let mut starts = access.starts;
    let distinct_starts = sort_dedup(&mut starts[..access.len]);
    let starts = &starts[..distinct_starts];
    let mut words = [0i64; WARP_LANES * MAX_WIDTH as usize];
    let mut n = 0;
    for &start in starts {
        for w in 0..width {
            words[n] = start + w;
            n += 1;
        }
    }
    // Distinct starts with one phase modulo the width cover disjoint words; others
    // (unaligned vectors, only in invalid states) may overlap.
    let phase = |s: i64| s & (width - 1);
    let first_phase = starts.first().map_or(0, |&s| phase(s));
    let distinct_words =
        if width.count_ones() == 1 && starts.iter().all(|&s| phase(s) == first_phase) {
            n
        } else {
            sort_dedup(&mut words[..n])
        };
    let mut per_bank = [0u32; MAX_BANKS];
    if banks.is_power_of_two() {
        let mask = banks as i64 - 1;
        for &word in &words[..distinct_words] {
            per_bank[(word & mask) as usize] += 1;
        }
    } else {
        for &word in &words[..distinct_words] {
            per_bank[word.rem_euclid(banks as i64) as usize] += 1;
        }
    }
    Cost {
        actual: per_bank.iter().copied().max().unwrap_or(0),
        ideal: distinct_words.div_ceil(banks) as u32,
    }
}

/// Number of distinct values (reorders `values`).
fn distinct(values: &mut [i64]) -> usize {
    sort_dedup(values)
}

/// Sorts and deduplicates in place (skipping the sort when the lanes are already in
/// order, the usual case); returns the number of distinct values, which lead `values`.
fn sort_dedup(values: &mut [i64]) -> usize {
    if values.is_empty() {
        return 0;
    }
    if !values.is_sorted() {
        values.sort_unstable();
    }
    let mut n = 1;
    for i in 1..values.len() {
        if values[i] != values[n - 1] {
            values[n] = values[i];
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warp(starts: impl IntoIterator<Item = i64>) -> WarpAccess {
        let mut access = WarpAccess::new();
        for s in starts {
            access.push(s);
        }
        access
    }

    #[test]
    fn thirty_two_consecutive_floats_are_four_sectors() {
        let cost = sectors(&warp(0..32), 1);
        assert_eq!(
            cost,
            Cost {
                actual: 4,
                ideal: 4
            }
        );
        // Misaligned by one float: the same 128 bytes span five sectors.
        assert_eq!(sectors(&warp(1..33), 1).actual, 5);
    }

    #[test]
    fn strided_lanes_touch_a_sector_each() {
        let cost = sectors(&warp((0..32).map(|l| l * 64)), 1);
        assert_eq!(
            cost,
            Cost {
                actual: 32,
                ideal: 4
            }
        );
    }

    #[test]
    fn vector_width_four_over_128_floats_is_sixteen_sectors() {
        let cost = sectors(&warp((0..32).map(|l| l * 4)), 4);
        assert_eq!(
            cost,
            Cost {
                actual: 16,
                ideal: 16
            }
        );
    }

    #[test]
    fn lanes_reading_one_float_share_its_sector() {
        assert_eq!(sectors(&warp([5; 32]), 1).actual, 1);
        assert_eq!(sectors(&warp([]), 1), Cost::default());
    }

    #[test]
    fn consecutive_words_have_no_conflict() {
        assert_eq!(
            wavefronts(&warp(0..32), 1, 32),
            Cost {
                actual: 1,
                ideal: 1
            }
        );
    }

    #[test]
    fn stride_two_is_a_two_way_conflict() {
        // Lanes l and l + 16 hit the same bank at different words.
        let cost = wavefronts(&warp((0..32).map(|l| 2 * l)), 1, 32);
        assert_eq!(
            cost,
            Cost {
                actual: 2,
                ideal: 1
            }
        );
    }

    #[test]
    fn stride_thirty_two_is_a_thirty_two_way_conflict() {
        let cost = wavefronts(&warp((0..32).map(|l| 32 * l)), 1, 32);
        assert_eq!(cost.actual, 32);
    }

    #[test]
    fn one_word_for_all_lanes_is_a_broadcast() {
        assert_eq!(wavefronts(&warp([7; 32]), 1, 32).actual, 1);
        // Two words in two banks, each read by 16 lanes: still one wavefront.
        let cost = wavefronts(&warp((0..32).map(|l| l / 16)), 1, 32);
        assert_eq!(cost.actual, 1);
    }

    #[test]
    fn vector_accesses_take_one_wavefront_per_128_bytes() {
        // 32 lanes x 16 contiguous bytes: four quarter-warp phases, no conflict.
        let cost = wavefronts(&warp((0..32).map(|l| 4 * l)), 4, 32);
        assert_eq!(
            cost,
            Cost {
                actual: 4,
                ideal: 4
            }
        );
        // All lanes reading the same 16 bytes: one broadcast wavefront.
        assert_eq!(wavefronts(&warp([8; 32]), 4, 32).actual, 1);
        // 64-bit accesses with a stride of 4 words use half of each 128-byte row.
        let cost = wavefronts(&warp((0..32).map(|l| 4 * l)), 2, 32);
        assert_eq!(
            cost,
            Cost {
                actual: 4,
                ideal: 2
            }
        );
        // Overlapping unaligned vectors (an invalid state) count each word once.
        let cost = wavefronts(&warp([0, 2, 4]), 4, 32);
        assert_eq!(
            cost,
            Cost {
                actual: 1,
                ideal: 1
            }
        );
    }
}
