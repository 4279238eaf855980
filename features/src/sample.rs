//! Which warp instructions stand for the whole kernel.
//!
//! Simulating every warp of every block is far too slow for scoring 10^5 states per
//! round, and most warps repeat the same pattern shifted in memory. The simulation
//! takes a few (instruction, block, stage) points of a low-discrepancy sequence, so
//! that padding rows, border blocks, tails and unaligned stage offsets are represented
//! in proportion without the aliasing of a regular grid. Everything is deterministic:
//! the same state gives the same features.

use crate::warp::WARP_LANES;

/// Increments of the "R2" sequence (from the plastic number): two coordinates of
/// low-discrepancy points.
pub(crate) const R2: [f64; 2] = [0.754_877_666_246_692_7, 0.569_840_290_998_053_3];
/// Increments of the "R3" sequence: three coordinates of low-discrepancy points.
pub(crate) const R3: [f64; 3] = [
    0.819_172_513_396_164_4,
    0.671_043_606_703_789_2,
    0.549_700_477_901_970_4,
];

/// The indices of about `max` samples out of `0..n`: when `n <= max`, every index
/// equally often (`max / n` times, so that each can be paired with several blocks and
/// stages), else `max` points of the Kronecker sequence with increment `alpha`. (Evenly
/// spaced strata would alias with the periodic structure of tiles: a stride of 51 warp
/// loads once landed every sample on the same padding rows of a conv tile.)
pub(crate) fn picks(n: i64, max: usize, alpha: f64) -> impl Iterator<Item = i64> {
    let n = n.max(0);
    let all = n <= max as i64;
    (0..pick_count(n, max)).map(move |k| {
        if all {
            k as i64 % n
        } else {
            scattered(k, n, alpha)
        }
    })
}

/// How many indices `picks(n, max, _)` yields.
fn pick_count(n: i64, max: usize) -> usize {
    match n.max(0) {
        0 => 0,
        n if n <= max as i64 => max / n as usize * n as usize,
        _ => max,
    }
}

/// Samples of the warp instructions `group * warps + warp` (`group` over `0..groups`:
/// fetch rounds, register positions), each with the number of instructions it stands
/// for. A block whose threads are not a multiple of 32 ends with a partial warp, whose
/// instructions cost less than the others: it is sampled as a stratum of its own (with
/// half the samples) so that neither kind is over-represented.
pub(crate) fn warp_instructions(
    groups: i64,
    threads: i64,
    max: usize,
    alpha: f64,
) -> impl Iterator<Item = (i64, f64)> {
    let full = threads / WARP_LANES as i64;
    let partial = threads % WARP_LANES as i64 != 0;
    let warps = full + i64::from(partial);
    let stratum = |n: i64, max: usize| {
        let count = pick_count(n, max);
        let weight = if count == 0 {
            0.0
        } else {
            n as f64 / count as f64
        };
        (n, max, weight)
    };
    let (n_full, max_full, w_full) = stratum(groups * full, max);
    let (n_partial, max_partial, w_partial) = if partial {
        stratum(groups, max.div_ceil(2))
    } else {
        stratum(0, 0)
    };
    let full_picks = picks(n_full, max_full, alpha)
        .map(move |i| ((i / full.max(1)) * warps + i % full.max(1), w_full));
    let partial_picks =
        picks(n_partial, max_partial, alpha).map(move |g| (g * warps + full, w_partial));
    full_picks.chain(partial_picks)
}

/// The `k`-th point of the Kronecker sequence with increment `alpha`, scaled to `0..n`.
pub(crate) fn scattered(k: usize, n: i64, alpha: f64) -> i64 {
    if n <= 1 {
        return 0;
    }
    let u = (0.5 + k as f64 * alpha).fract();
    ((u * n as f64) as i64).clamp(0, n - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_ranges_are_taken_whole() {
        assert_eq!(picks(3, 8, R3[0]).collect::<Vec<_>>(), [0, 1, 2, 0, 1, 2]);
        assert_eq!(picks(0, 8, R3[0]).count(), 0);
    }

    #[test]
    fn large_ranges_are_spread() {
        let points: Vec<i64> = picks(80, 8, R3[0]).collect();
        assert_eq!(points.len(), 8);
        let mut sorted = points.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        assert!(points.iter().all(|&p| (0..80).contains(&p)));
    }

    #[test]
    fn a_partial_warp_is_its_own_stratum() {
        // 40 threads: a full warp and one of 8 lanes, 3 rounds each.
        let picks: Vec<(i64, f64)> = warp_instructions(3, 40, 8, R3[0]).collect();
        let full: Vec<_> = picks.iter().filter(|(j, _)| j % 2 == 0).collect();
        let partial: Vec<_> = picks.iter().filter(|(j, _)| j % 2 == 1).collect();
        assert_eq!((full.len(), partial.len()), (6, 3));
        let weight = |p: &[&(i64, f64)]| p.iter().map(|(_, w)| w).sum::<f64>();
        assert_eq!((weight(&full), weight(&partial)), (3.0, 3.0));
        // Whole warps only: one stratum.
        let picks: Vec<(i64, f64)> = warp_instructions(100, 64, 8, R3[0]).collect();
        assert_eq!(picks.len(), 8);
        assert_eq!(picks.iter().map(|(_, w)| w).sum::<f64>(), 200.0);
        assert!(picks.iter().all(|(j, _)| (0..200).contains(j)));
    }

    #[test]
    fn scattered_points_stay_in_range_and_spread() {
        let points: Vec<i64> = (0..8).map(|k| scattered(k, 100, R2[0])).collect();
        assert!(points.iter().all(|&p| (0..100).contains(&p)));
        let mut sorted = points.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        assert_eq!(scattered(5, 1, R2[0]), 0);
    }
}
