//! The neighbours greedy and annealing choose among: slides of a memory instruction
//! (ranked by the cover estimate) and patterns of control-bit edits over the hot loop.
//!
//! One edit of one stall count is rarely measurable; what paid on Hopper were edits
//! applied across a loop body (DeepGEMM's yield flip on alternate FFMAs). A pattern is a
//! sequence of single legal actions (`moves::Kind`) over every instance of an opcode in
//! the hot block, each checked by the legality rules as it is applied, so a candidate
//! is legal by construction.

use crate::agents::estimate::{ranked, slide};
use crate::legality::analysis::Kernel;
use crate::legality::moves::{Action, Kind};
use crate::legality::order::Order;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// Slides per neighbourhood (the best by the cover estimate).
const SLIDES: usize = 24;
/// Longest slide of one memory instruction.
pub const MAX_SLIDE: usize = 8;
/// Random single edits per neighbourhood (for diversity).
const SINGLES: usize = 6;

/// How a candidate was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Generator {
    /// One memory instruction slid up to `MAX_SLIDE` slots.
    Slide,
    /// Yield flipped on every other instance of an opcode (reuse flags cleared there).
    YieldAlternate,
    /// Yield flipped on every instance of an opcode.
    YieldAll,
    /// Reuse flags cleared on every instance of an opcode.
    ReuseClear,
    /// Every settable reuse flag of the hot block set.
    ReuseSet,
    /// One stall cycle less on every instance of an opcode, where legal.
    StallDown,
    /// One stall cycle more on every instance of an opcode.
    StallUp,
    /// One random control edit.
    Single,
}

/// A neighbour of the current candidate.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub order: Order,
    pub generator: Generator,
    /// The cover estimate's value for slides, 0 otherwise.
    pub estimate: i64,
}

/// Opcodes the patterns apply to: the hot block's most frequent arithmetic and memory
/// opcodes.
pub fn pattern_opcodes(kernel: &Kernel) -> Vec<String> {
    let block = kernel.blocks[kernel.hot_block()].clone();
    let mut math: BTreeMap<&str, usize> = BTreeMap::new();
    let mut memory: BTreeMap<&str, usize> = BTreeMap::new();
    for i in block {
        let ins = &kernel.instructions[i];
        if kernel.pinned[i].is_some() {
            continue;
        }
        if ins.movable() {
            *memory.entry(ins.base.as_str()).or_default() += 1;
        } else if matches!(
            ins.base.as_str(),
            "HMMA" | "FFMA" | "HFMA2" | "FMUL" | "FADD" | "IMAD" | "IMMA"
        ) {
            *math.entry(ins.base.as_str()).or_default() += 1;
        }
    }
    let top = |m: BTreeMap<&str, usize>| {
        m.into_iter()
            .max_by_key(|&(k, n)| (n, std::cmp::Reverse(k)))
            .map(|(k, _)| k.to_string())
    };
    top(math).into_iter().chain(top(memory)).collect()
}

/// Applies `kind` to each original instruction of `indices` where legal, in turn.
fn apply_each(kernel: &Kernel, order: &mut Order, indices: &[usize], kind: Kind) -> usize {
    let mut applied = 0;
    for &i in indices {
        let action = Action {
            row: order.position(i),
            kind,
        };
        if kernel.legal(order, action) {
            kernel.apply(order, action);
            applied += 1;
        }
    }
    applied
}

/// The neighbours of `current`: slides, then patterns, then `SINGLES` random single
/// edits drawn with `seed`. Candidates equal to `current` are left out.
pub fn neighbours(kernel: &Kernel, current: &Order, seed: u64) -> Vec<Candidate> {
    let mut out = Vec::new();
    for (action, value) in ranked(kernel, current)
        .into_iter()
        .filter(|&(_, v)| v >= 0)
        .take(SLIDES)
    {
        if let Some((order, _, total)) = slide(kernel, current, action, MAX_SLIDE, true) {
            out.push(Candidate {
                order,
                generator: Generator::Slide,
                estimate: total.max(value),
            });
        }
    }
    let hot = kernel.blocks[kernel.hot_block()].clone();
    // Hot-block instances of `opcode` in current order, as original indices.
    let instances = |opcode: &str| -> Vec<usize> {
        hot.clone()
            .map(|p| current.at(p))
            .filter(|&i| kernel.instructions[i].base == opcode)
            .collect()
    };
    let mut pattern = |generator: Generator, indices: &[usize], kind: Kind| {
        let mut order = current.clone();
        if apply_each(kernel, &mut order, indices, kind) > 0 {
            out.push(Candidate {
                order,
                generator,
                estimate: 0,
            });
        }
    };
    for opcode in pattern_opcodes(kernel) {
        let all = instances(&opcode);
        let alternate: Vec<usize> = all.iter().copied().step_by(2).collect();
        pattern(Generator::YieldAlternate, &alternate, Kind::Yield);
        pattern(Generator::YieldAll, &all, Kind::Yield);
        pattern(Generator::ReuseClear, &all, Kind::ReuseClear);
        pattern(Generator::StallDown, &all, Kind::StallDown);
        pattern(Generator::StallUp, &all, Kind::StallUp);
    }
    let everything: Vec<usize> = hot.clone().map(|p| current.at(p)).collect();
    pattern(Generator::ReuseSet, &everything, Kind::ReuseSet);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let singles = [
        Kind::Yield,
        Kind::StallDown,
        Kind::StallUp,
        Kind::ReuseClear,
    ];
    for _ in 0..SINGLES {
        if hot.is_empty() {
            break;
        }
        let p = hot.start + (rng.next_u64() % hot.len() as u64) as usize;
        let kind = singles[(rng.next_u64() % singles.len() as u64) as usize];
        pattern(Generator::Single, &[current.at(p)], kind);
    }
    out.retain(|c| c.order != *current);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legality::testkit::kernel_of;

    #[test]
    fn every_neighbour_verifies_and_patterns_cover_the_math_opcode() {
        let k = kernel_of(&[
            ("FFMA R20, R21, R22, R20", 4, 0b0011),
            ("FFMA R24, R21, R22, R24", 4, 0b0011),
            ("LDS R4, [R8]", 2, 0),
            ("FFMA R26, R21, R22, R26", 4, 0),
            ("FFMA R28, R21, R23, R28", 4, 0),
            ("FFMA R30, R4, R23, R30", 4, 0),
            ("EXIT", 5, 0),
        ]);
        let n = neighbours(&k, &Order::identity(k.len()), 1);
        assert!(!n.is_empty());
        for c in &n {
            assert_eq!(k.verify(&c.order), Ok(()), "{:?}", c.generator);
        }
        let generators: Vec<Generator> = n.iter().map(|c| c.generator).collect();
        for g in [
            Generator::YieldAlternate,
            Generator::ReuseClear,
            Generator::StallUp,
            Generator::ReuseSet,
        ] {
            assert!(generators.contains(&g), "{g:?} missing from {generators:?}");
        }
        assert_eq!(pattern_opcodes(&k), vec!["FFMA".to_string(), "LDS".into()]);
    }
}
