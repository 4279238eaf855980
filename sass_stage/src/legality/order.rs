//! A candidate kernel as the stage edits it: the order of its instructions and the
//! edits of their control bits; the moves the agents may make, applying them,
//! re-checking a whole candidate against every dependency, and the words to write.
//!
//! A move swaps a memory instruction with its neighbour inside a basic block. It is
//! legal when neither is pinned, no dependency edge joins them, and every distance
//! constraint touching either still holds afterwards (control edits: `control.rs`).
//! Writing an order permutes the 16-byte words, applies the control edits and keeps an
//! operand-reuse flag only where it is still valid: an original flag while the
//! instruction's successor is the original one (a reuse flag promises the value to the
//! next instruction), any flag where the next instruction provably reads the cached
//! operand (`Kernel::reusable`), and none on a yielding instruction.

use crate::decode::control::Control;
use crate::legality::analysis::{Dep, Kernel};
use crate::legality::moves::{Action, KINDS, Kind};
use std::collections::BTreeMap;

/// Instruction order and control-bit edits: `at[position]` is an original index, `pos`
/// its inverse; `edits` holds the new control bits of edited instructions by original
/// index (never an entry equal to the original bits).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Order {
    at: Vec<u32>,
    pos: Vec<u32>,
    edits: BTreeMap<u32, Control>,
}

/// Why an order is not legal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("the order is not a permutation of the kernel's {0} instructions")]
    NotAPermutation(usize),
    #[error("instruction {0} left its basic block")]
    LeftBlock(usize),
    #[error("pinned instruction {0} moved")]
    PinnedMoved(usize),
    #[error("instruction {to} now precedes {from} ({dep:?} dependency)")]
    Order { from: usize, to: usize, dep: Dep },
    #[error("instructions {producer} → {consumer} are {cycles} cycles apart, {needed} needed")]
    Distance {
        producer: usize,
        consumer: usize,
        cycles: u32,
        needed: u32,
    },
    #[error("instruction {0} is too close to the edge of its block")]
    BlockEdge(usize),
    #[error("instruction {0} (pinned or a NOP) has edited control bits")]
    NotEditable(usize),
    #[error("instruction {0} has control bits sm_90 cannot encode")]
    Unencodable(usize),
    #[error("instruction {index} stalls {stall} cycles, below the {floor} ptxas ever gives it")]
    StallFloor { index: usize, stall: u8, floor: u8 },
    #[error("instruction {index} sets reuse flags {flags:#06b} its successor cannot use")]
    Reuse { index: usize, flags: u8 },
    #[error("instruction {0} yields and keeps operand-reuse flags")]
    YieldWithReuse(usize),
    #[error("instruction {0}'s edit changes bits other than stall, yield and reuse")]
    EditedField(usize),
}

impl Order {
    /// The original order.
    pub fn identity(n: usize) -> Order {
        let at: Vec<u32> = (0..n as u32).collect();
        Order {
            pos: at.clone(),
            at,
            edits: BTreeMap::new(),
        }
    }

    /// An order from `at[position] = original index` (checked by `Kernel::verify`).
    pub fn from_positions(at: Vec<u32>) -> Order {
        let mut pos = vec![u32::MAX; at.len()];
        for (p, &i) in at.iter().enumerate() {
            if let Some(slot) = pos.get_mut(i as usize) {
                *slot = p as u32;
            }
        }
        Order {
            at,
            pos,
            edits: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Original index of the instruction at `position`.
    pub fn at(&self, position: usize) -> usize {
        self.at[position] as usize
    }

    /// Current position of original instruction `index`.
    pub fn position(&self, index: usize) -> usize {
        self.pos[index] as usize
    }

    pub fn positions(&self) -> &[u32] {
        &self.at
    }

    /// Swaps the instructions at `p` and `p + 1`.
    pub fn swap(&mut self, p: usize) {
        self.at.swap(p, p + 1);
        self.pos[self.at[p] as usize] = p as u32;
        self.pos[self.at[p + 1] as usize] = (p + 1) as u32;
    }

    /// Original indices whose position differs from the original.
    pub fn moved(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| self.pos[i] as usize != i)
            .collect()
    }

    /// The edited control bits of original instruction `index`, if edited.
    pub fn edit(&self, index: usize) -> Option<Control> {
        self.edits.get(&(index as u32)).copied()
    }

    /// Edited instructions (original indices) with their new control bits.
    pub fn edits(&self) -> impl Iterator<Item = (usize, Control)> + '_ {
        self.edits.iter().map(|(&i, &c)| (i as usize, c))
    }

    /// Gives original instruction `index` the control bits `control` (`original` being
    /// its bits in the kernel, so that an edit back to them leaves no entry).
    pub fn set_control(&mut self, index: usize, control: Control, original: Control) {
        if control == original {
            self.edits.remove(&(index as u32));
        } else {
            self.edits.insert(index as u32, control);
        }
    }

    /// Neither moved nor edited.
    pub fn is_original(&self) -> bool {
        self.edits.is_empty() && self.moved().is_empty()
    }
}

impl Kernel {
    /// The control bits of original instruction `index` in `order` (edited or original;
    /// reuse flags as edited, before `effective_control` drops the invalid ones).
    pub fn control(&self, order: &Order, index: usize) -> Control {
        order
            .edit(index)
            .unwrap_or(self.instructions[index].control)
    }

    pub(crate) fn stall(&self, order: &Order, index: usize) -> u32 {
        u32::from(self.control(order, index).stall)
    }

    /// Stall cycles between the issue of the instructions at positions `from` and `to`,
    /// counting at most up to `enough`.
    pub(crate) fn cycles(&self, order: &Order, from: usize, to: usize, enough: u32) -> u32 {
        let mut sum = 0;
        for p in from..to {
            sum += self.stall(order, order.at(p));
            if sum >= enough {
                break;
            }
        }
        sum
    }

    /// Whether the distance constraints touching original instruction `i` hold.
    pub(crate) fn distances_hold(&self, order: &Order, i: usize) -> Result<(), Violation> {
        for &k in &self.distances_of[i] {
            let d = self.distances[k];
            let (p, c) = (order.position(d.producer), order.position(d.consumer));
            let cycles = if p < c {
                self.cycles(order, p, c, d.cycles)
            } else {
                0
            };
            if cycles < d.cycles {
                return Err(Violation::Distance {
                    producer: d.producer,
                    consumer: d.consumer,
                    cycles,
                    needed: d.cycles,
                });
            }
        }
        Ok(())
    }

    /// Whether the block-edge distances of the instructions in `indices` hold.
    pub(crate) fn block_edges_hold(
        &self,
        order: &Order,
        indices: &[usize],
    ) -> Result<(), Violation> {
        for e in &self.from_block_start {
            if indices.contains(&e.instruction) {
                let block = &self.blocks[self.block_of[e.instruction]];
                let p = order.position(e.instruction);
                if self.cycles(order, block.start, p, e.cycles) < e.cycles {
                    return Err(Violation::BlockEdge(e.instruction));
                }
            }
        }
        for e in &self.to_block_end {
            if indices.contains(&e.instruction) {
                let block = &self.blocks[self.block_of[e.instruction]];
                let p = order.position(e.instruction);
                if self.cycles(order, p, block.end, e.cycles) < e.cycles {
                    return Err(Violation::BlockEdge(e.instruction));
                }
            }
        }
        Ok(())
    }

    /// The position a move takes the instruction at `action.row` to, if the move
    /// stays in bounds.
    fn partner(&self, action: Action) -> Option<usize> {
        match action.kind {
            Kind::Up => action.row.checked_sub(1),
            Kind::Down => (action.row + 1 < self.len()).then_some(action.row + 1),
            _ => None,
        }
    }

    /// Whether `action` is legal in `order`.
    pub fn legal(&self, order: &Order, action: Action) -> bool {
        if action.row >= self.len() {
            return false;
        }
        if action.kind.is_swap() {
            self.swap_legal(order, action)
        } else {
            self.control_legal(order, action, None)
        }
    }

    fn swap_legal(&self, order: &Order, action: Action) -> bool {
        let Some(other) = self.partner(action) else {
            return false;
        };
        let (a, b) = (order.at(action.row), order.at(other));
        if !self.instructions[a].movable()
            || self.pinned[a].is_some()
            || self.pinned[b].is_some()
            || self.block_of[a] != self.block_of[b]
            || self.graph.contains_edge(a as u32, b as u32)
            || self.graph.contains_edge(b as u32, a as u32)
        {
            return false;
        }
        let mut after = order.clone();
        after.swap(action.row.min(other));
        self.distances_hold(&after, a).is_ok()
            && self.distances_hold(&after, b).is_ok()
            && self.block_edges_hold(&after, &[a, b]).is_ok()
    }

    /// Every legal action in `order`, as a mask over action indices.
    pub fn legal_mask(&self, order: &Order) -> Vec<bool> {
        let slack = self.stall_slack(order);
        (0..KINDS * self.len())
            .map(|i| {
                let action = Action::from_index(i);
                if action.kind.is_swap() {
                    self.swap_legal(order, action)
                } else {
                    self.control_legal(order, action, Some(&slack))
                }
            })
            .collect()
    }

    /// Whether any action of `kinds` is legal somewhere in `order`, as a mask over
    /// action indices with every other kind false (cheaper than `legal_mask` when only
    /// swaps are wanted).
    pub fn legal_mask_of(&self, order: &Order, kinds: &[Kind]) -> Vec<bool> {
        let slack = kinds
            .contains(&Kind::StallDown)
            .then(|| self.stall_slack(order));
        (0..KINDS * self.len())
            .map(|i| {
                let action = Action::from_index(i);
                if !kinds.contains(&action.kind) {
                    false
                } else if action.kind.is_swap() {
                    self.swap_legal(order, action)
                } else {
                    self.control_legal(order, action, slack.as_deref())
                }
            })
            .collect()
    }

    /// Up to `steps` uniformly random legal actions from the original order, seeded:
    /// the actions taken (stops early where none is legal). Tests of the legality rules
    /// replay them on the CPU and on the GPU.
    pub fn random_walk(&self, steps: usize, seed: u64) -> Vec<Action> {
        self.random_walk_of(steps, seed, &Kind::ALL)
    }

    /// `random_walk` restricted to actions of `kinds`.
    pub fn random_walk_of(&self, steps: usize, seed: u64, kinds: &[Kind]) -> Vec<Action> {
        use rand_chacha::ChaCha8Rng;
        use rand_chacha::rand_core::{Rng, SeedableRng};
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut order = Order::identity(self.len());
        let mut walk = Vec::new();
        for _ in 0..steps {
            let legal: Vec<usize> = self
                .legal_mask_of(&order, kinds)
                .iter()
                .enumerate()
                .filter_map(|(i, &l)| l.then_some(i))
                .collect();
            if legal.is_empty() {
                break;
            }
            let action = Action::from_index(legal[(rng.next_u64() % legal.len() as u64) as usize]);
            self.apply(&mut order, action);
            walk.push(action);
        }
        walk
    }

    /// The order that `walk` leads to from the original order.
    pub fn replay(&self, walk: &[Action]) -> Order {
        let mut order = Order::identity(self.len());
        for &action in walk {
            self.apply(&mut order, action);
        }
        order
    }

    /// Applies `action`, which must be legal.
    pub fn apply(&self, order: &mut Order, action: Action) {
        debug_assert!(self.legal(order, action));
        if action.kind.is_swap() {
            let other = self.partner(action).expect("legal actions stay in bounds");
            order.swap(action.row.min(other));
        } else {
            self.apply_control(order, action);
        }
    }

    /// Re-checks a whole order against every constraint.
    pub fn verify(&self, order: &Order) -> Result<(), Violation> {
        let n = self.len();
        if order.len() != n || order.pos.iter().any(|&p| p as usize >= n) {
            return Err(Violation::NotAPermutation(n));
        }
        for i in 0..n {
            if order.at(order.position(i)) != i {
                return Err(Violation::NotAPermutation(n));
            }
            let block = &self.blocks[self.block_of[i]];
            if !block.contains(&order.position(i)) {
                return Err(Violation::LeftBlock(i));
            }
            if self.pinned[i].is_some() && order.position(i) != i {
                return Err(Violation::PinnedMoved(i));
            }
        }
        for (from, to, &dep) in self.graph.all_edges() {
            if order.position(from as usize) > order.position(to as usize) {
                return Err(Violation::Order {
                    from: from as usize,
                    to: to as usize,
                    dep,
                });
            }
        }
        for i in 0..n {
            self.distances_hold(order, i)?;
        }
        let all: Vec<usize> = self
            .from_block_start
            .iter()
            .chain(&self.to_block_end)
            .map(|e| e.instruction)
            .collect();
        self.block_edges_hold(order, &all)?;
        self.verify_controls(order)
    }

    /// The kernel's words in `order`: permuted, control edits applied, and only valid
    /// reuse flags kept.
    pub fn words(&self, order: &Order) -> Vec<(u64, u64)> {
        (0..self.len())
            .map(|p| {
                let ins = &self.instructions[order.at(p)];
                (ins.low, self.effective_control(order, p).encode(ins.high))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legality::testkit::{ctl, kernel};

    fn up(row: usize) -> Action {
        Action {
            row,
            kind: Kind::Up,
        }
    }

    /// Moving `row` up is illegal, and the verifier names `dep` for the swapped order.
    fn blocked_by(k: &Kernel, row: usize, dep: Dep) {
        let (legal, verdict) = swap_verdict(k, row);
        assert!(!legal, "row {row} may move up");
        assert!(
            matches!(verdict, Err(Violation::Order { dep: d, .. }) if d == dep),
            "{verdict:?}"
        );
    }

    fn swap_verdict(k: &Kernel, row: usize) -> (bool, Result<(), Violation>) {
        let legal = k.legal(&Order::identity(k.len()), up(row));
        let mut order = Order::identity(k.len());
        order.swap(row - 1);
        (legal, k.verify(&order))
    }

    #[test]
    fn independent_load_may_move_up_and_the_original_verifies() {
        let k = kernel(&[
            ("FFMA R20, R21, R22, R20", ctl(4, None, 0)),
            ("LDG.E R4, desc[UR4][R8.64]", ctl(1, Some(0), 0)),
            ("EXIT", ctl(5, None, 1)),
        ]);
        assert_eq!(k.verify(&Order::identity(3)), Ok(()));
        let (legal, verdict) = swap_verdict(&k, 1);
        assert!(legal);
        assert_eq!(verdict, Ok(()));
        // The pinned EXIT and the block edge stop everything else.
        let mask = k.legal_mask_of(&Order::identity(3), &[Kind::Up, Kind::Down]);
        assert_eq!(mask.iter().filter(|&&m| m).count(), 1);
    }

    #[test]
    fn register_pairs_are_dependencies() {
        let k = kernel(&[
            ("LDG.E.64 R4, desc[UR4][R8.64]", ctl(1, None, 0)),
            ("FADD R10, R5, R5", ctl(4, None, 0)),
            ("IMAD.WIDE R8, R2, 0x4, R6", ctl(4, None, 0)),
            ("LDG.E R12, desc[UR4][R9.64]", ctl(1, Some(1), 0)),
        ]);
        blocked_by(&k, 1, Dep::Raw);
        // R9 is the high half of the IMAD.WIDE result.
        blocked_by(&k, 3, Dep::Raw);
    }

    #[test]
    fn two_users_of_one_scoreboard_keep_their_order() {
        let k = kernel(&[
            ("LDS R4, [R2]", ctl(1, Some(0), 0)),
            ("LDS R5, [R3]", ctl(1, Some(0), 0)),
        ]);
        blocked_by(&k, 1, Dep::Scoreboard);
    }

    #[test]
    fn a_barrier_holder_does_not_pass_an_untracked_load() {
        let k = kernel(&[
            ("LDS R4, [R2]", ctl(1, None, 0)),
            ("LDS R5, [R3]", ctl(1, Some(0), 0)),
            ("FADD R6, R4, R5", ctl(4, None, 1)),
        ]);
        blocked_by(&k, 1, Dep::Untracked);
    }

    #[test]
    fn stall_distances_to_a_load_address_are_kept() {
        let k = kernel(&[
            ("IADD3 R8, R8, 0x10, RZ", ctl(1, None, 0)),
            ("FFMA R20, R21, R22, R20", ctl(6, None, 0)),
            ("LDG.E R4, desc[UR4][R8.64]", ctl(1, Some(0), 0)),
        ]);
        let (legal, verdict) = swap_verdict(&k, 2);
        assert!(!legal);
        assert!(
            matches!(
                verdict,
                Err(Violation::Distance {
                    cycles: 1,
                    needed: 7,
                    ..
                })
            ),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_scoreboard_is_set_long_enough_before_its_waiter() {
        // Found on an H100: the STS moved next to the IADD3 that waits on its read
        // scoreboard, the wait saw the scoreboard unset, and R27 was overwritten before
        // the store read it (a misaligned address).
        let mut read_sb1 = ctl(1, None, 0);
        read_sb1.read_barrier = Some(1);
        let k = kernel(&[
            ("STS [R27+0x18], R15", read_sb1),
            ("CS2R R12, SRZ", ctl(2, None, 0)),
            ("IADD3 R27, R33, R2, RZ", ctl(2, None, 0b10)),
        ]);
        let mut order = Order::identity(3);
        assert!(!k.legal(
            &order,
            Action {
                row: 0,
                kind: Kind::Down
            }
        ));
        order.swap(0);
        assert!(matches!(
            k.verify(&order),
            Err(Violation::Distance { cycles: 0, .. } | Violation::Distance { cycles: 1, .. })
        ));
    }

    #[test]
    fn a_late_read_stays_before_the_scoreboard_its_writer_relies_on() {
        // The first LDS has no read scoreboard: the IADD3 that overwrites R8 relies on
        // the wait for the second LDS (operands are read in issue order).
        let mut read_sb2 = ctl(2, Some(0), 0);
        read_sb2.read_barrier = Some(2);
        let k = kernel(&[
            ("LDS R4, [R8]", ctl(2, Some(1), 0)),
            ("LDS R5, [R9]", read_sb2),
            ("IADD3 R8, R8, 0x4, RZ", ctl(2, None, 0b100)),
        ]);
        blocked_by(&k, 1, Dep::Untracked);
    }

    #[test]
    fn a_use_covered_by_an_earlier_wait_stays_after_it() {
        let k = kernel(&[
            ("LDG.E R4, desc[UR4][R8.64]", ctl(1, Some(0), 0)),
            ("FADD R6, R4, R4", ctl(4, None, 1)),
            ("STS [R10], R4", ctl(1, None, 0)),
        ]);
        // The STS reads R4 without waiting: only the FADD's wait makes that safe.
        blocked_by(&k, 2, Dep::Coverage);
    }

    #[test]
    fn loads_do_not_cross_stores_of_the_same_space() {
        let k = kernel(&[
            ("STS [R10], R11", ctl(1, None, 0)),
            ("LDS R4, [R12]", ctl(1, Some(0), 0)),
            ("STG.E desc[UR4][R14.64], R15", ctl(1, None, 0)),
            ("LDS R5, [R13]", ctl(1, Some(1), 0)),
        ]);
        let (legal, verdict) = swap_verdict(&k, 1);
        assert!(
            !legal
                && matches!(
                    verdict,
                    Err(Violation::Order {
                        dep: Dep::Memory,
                        ..
                    })
                )
        );
        // Global store, shared load: free.
        let (legal, verdict) = swap_verdict(&k, 3);
        assert!(legal && verdict.is_ok(), "{verdict:?}");
    }

    #[test]
    fn words_clear_reuse_flags_where_the_successor_changed() {
        let mut reuse = ctl(1, None, 0);
        reuse.reuse = 0b0011;
        let k = kernel(&[
            ("FFMA R20, R21, R22, R20", reuse),
            ("FFMA R24, R21, R22, R24", reuse),
            ("LDG.E R4, desc[UR4][R8.64]", ctl(1, Some(0), 0)),
            ("FFMA R26, R21, R22, R26", reuse),
        ]);
        let mut order = Order::identity(4);
        assert_eq!(k.words(&order)[0].1, k.instructions[0].high);
        k.apply(&mut order, up(2));
        let words = k.words(&order);
        let reuse_of = |w: (u64, u64)| Control::decode(w.1).reuse;
        assert_eq!(words[1].0, 2, "the load moved up");
        assert_eq!(reuse_of(words[0]), 0, "the instruction before the pair");
        assert_eq!(reuse_of(words[1]), 0, "the moved pair");
        // The second FFMA's new successor reads R21 and R22 in the same slots: its
        // flags are still valid there.
        assert_eq!(reuse_of(words[2]), 0b0011, "valid for the new successor");
        assert_eq!(reuse_of(words[3]), 0b0011, "untouched");
    }
}
