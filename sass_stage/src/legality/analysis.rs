//! What may move: basic blocks, pinned instructions, and the dependency graph that any
//! reordering must respect.
//!
//! The graph (petgraph) holds an edge `u → v` for every pair that must keep its
//! original order: register and predicate def-use in both directions and def-def;
//! scoreboard events (two users of one barrier, a barrier set before its waiter, a wait
//! before the next set); wait coverage (an instruction that relies on an earlier
//! instruction's wait for a variable-latency result stays after that wait — found by a
//! dataflow of pending scoreboards over the control-flow graph); memory order (no access
//! crosses a store or atomic of a space it may alias); and untracked variable-latency
//! results (a load without a barrier of its own is covered by a later one's, so it keeps
//! its order with every other variable-latency instruction).
//!
//! Fixed-latency results need distance, not order: ptxas encodes the issue distance in
//! stall counts, so every producer → consumer pair keeps at least the smaller of its
//! original distance and the latency the producer needs (the minimum distance observed
//! for that producer opcode in this kernel, or the built-in table in `latency.rs`;
//! unknown producers keep their original distance). Pairs that cross a block boundary
//! are covered by keeping the stall cycles between a fixed-latency definition and the
//! block end, and between the block start and a use of a register such a definition may
//! reach, at their original values (capped at the longest fixed latency).

use crate::SassError;
use crate::decode::cubin::{KernelText, WORD_BYTES};
use crate::decode::disasm::Line;
use crate::decode::instr::{Instruction, REG_IDS};
use crate::legality::control::ControlRules;
use crate::legality::latency::{self, Key};
use crate::legality::profile::class_of;
use petgraph::graphmap::DiGraphMap;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

/// Why two instructions must keep their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dep {
    /// Read after write of a register or predicate.
    Raw,
    /// Write after read.
    War,
    /// Write after write.
    Waw,
    /// Events on one scoreboard.
    Scoreboard,
    /// The later instruction relies on the earlier one's wait.
    Coverage,
    /// Accesses to one memory space, at least one a store or atomic.
    Memory,
    /// A variable-latency result without a barrier of its own.
    Untracked,
}

/// Why an instruction may not move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pin {
    /// Control flow, barriers, fences, warp-wide operations, CTA-id reads.
    Opcode,
    /// Its offset is named in `.nv.info.<kernel>`.
    InfoAttribute,
    /// A relocation patches it.
    Relocation,
}

/// A fixed-latency producer → consumer pair that must stay `cycles` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Distance {
    pub producer: usize,
    pub consumer: usize,
    pub cycles: u32,
}

/// A minimum of stall cycles between an instruction and the edge of its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeDistance {
    pub instruction: usize,
    pub cycles: u32,
}

/// The analysed kernel: instructions in original order (index = original position).
#[derive(Debug, Clone)]
pub struct Kernel {
    pub name: String,
    pub instructions: Vec<Instruction>,
    pub pinned: Vec<Option<Pin>>,
    /// Blocks as ranges of original positions.
    pub blocks: Vec<Range<usize>>,
    pub block_of: Vec<usize>,
    /// Must-precede edges between original positions (within blocks).
    pub graph: DiGraphMap<u32, Dep>,
    pub distances: Vec<Distance>,
    /// Stall cycles from the block start to the instruction (exclusive) must stay at
    /// least this (a use a fixed-latency definition in another block may reach).
    pub from_block_start: Vec<EdgeDistance>,
    /// Stall cycles from the instruction (inclusive) to the block end must stay at
    /// least this (a fixed-latency definition that may reach another block).
    pub to_block_end: Vec<EdgeDistance>,
    /// Constraints touching each instruction: indices into `distances`.
    pub distances_of: Vec<Vec<usize>>,
    /// What the original control bits show (stall floors, reuse, yield encoding).
    pub rules: ControlRules,
    /// `reach[a][b]`: block b can run after block a (through at least one edge).
    reach: Vec<Vec<bool>>,
    /// `defined_in[b][r]`: block b writes register r.
    defined_in: Vec<Vec<bool>>,
}

impl Kernel {
    /// Decodes and analyses a kernel: `lines` from nvdisasm must match `text`'s words.
    pub fn analyze(text: &KernelText, lines: &[Line]) -> Result<Kernel, SassError> {
        if lines.len() != text.words.len() {
            return Err(SassError::Tool(format!(
                "nvdisasm lists {} instructions for {} but its text holds {}",
                lines.len(),
                text.name,
                text.words.len()
            )));
        }
        for (i, (line, &(low, high))) in lines.iter().zip(&text.words).enumerate() {
            if line.offset != i * WORD_BYTES || line.low != low || line.high != high {
                return Err(SassError::Tool(format!(
                    "nvdisasm's instruction at {:#x} does not match the cubin's bytes",
                    line.offset
                )));
            }
        }
        let instructions: Vec<Instruction> = lines.iter().map(Instruction::parse).collect();
        let rules = ControlRules::observe(&instructions);
        let pinned = instructions
            .iter()
            .map(|ins| {
                if ins.pinned_by_opcode() {
                    Some(Pin::Opcode)
                } else if text.info_offsets.contains(&ins.offset) {
                    Some(Pin::InfoAttribute)
                } else if text.relocated.contains(&ins.offset) {
                    Some(Pin::Relocation)
                } else {
                    None
                }
            })
            .collect();
        let blocks = split_blocks(&instructions);
        let mut block_of = vec![0; instructions.len()];
        for (b, range) in blocks.iter().enumerate() {
            for i in range.clone() {
                block_of[i] = b;
            }
        }
        let mut kernel = Kernel {
            name: text.name.clone(),
            instructions,
            pinned,
            blocks,
            block_of,
            graph: DiGraphMap::new(),
            distances: Vec::new(),
            from_block_start: Vec::new(),
            to_block_end: Vec::new(),
            distances_of: Vec::new(),
            rules,
            reach: Vec::new(),
            defined_in: Vec::new(),
        };
        let successors = kernel.successors();
        kernel.reach = reachability(&successors);
        kernel.defined_in = kernel
            .blocks
            .iter()
            .map(|range| {
                let mut defined = vec![false; REG_IDS];
                for i in range.clone() {
                    for &r in &kernel.instructions[i].defs {
                        defined[r as usize] = true;
                    }
                }
                defined
            })
            .collect();
        let pending_in = kernel.pending_at_entry(&successors);
        for (b, pending) in pending_in.iter().enumerate() {
            kernel.block_edges(b, pending);
        }
        kernel.latency_constraints(&successors);
        Ok(kernel)
    }

    pub fn len(&self) -> usize {
        self.instructions.len()
    }

    /// A few lines on what constrains this kernel.
    pub fn summary(&self) -> String {
        let count = |pin: Pin| self.pinned.iter().filter(|p| **p == Some(pin)).count();
        let mut deps: BTreeMap<String, usize> = BTreeMap::new();
        for (_, _, dep) in self.graph.all_edges() {
            *deps.entry(format!("{dep:?}").to_lowercase()).or_default() += 1;
        }
        let deps: Vec<String> = deps.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!(
            "kernel {}: {} instructions in {} basic blocks, {} movable memory instructions\n\
             pinned: {} by opcode, {} by .nv.info offsets, {} under relocations\n\
             order edges: {}\n\
             distance constraints: {} pairs, {} block-edge\n\
             {}\n",
            self.name,
            self.len(),
            self.blocks.len(),
            self.instructions.iter().filter(|i| i.movable()).count(),
            count(Pin::Opcode),
            count(Pin::InfoAttribute),
            count(Pin::Relocation),
            deps.join(", "),
            self.distances.len(),
            self.from_block_start.len() + self.to_block_end.len(),
            self.issue_profile(self.hot_block()).line(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.instructions.is_empty()
    }

    /// The block where the time goes: of the blocks that can run again after
    /// themselves (loop bodies), the one with the most MMA/FMA instructions, then the
    /// largest; without loops, the largest block. (Largest alone picked address and
    /// prefetch blocks of the tensor-core kernels, and the one-instruction `BRA` to
    /// itself that ends every kernel.)
    pub fn hot_block(&self) -> usize {
        let size = |b: usize| self.blocks[b].len();
        let math = |b: usize| {
            self.blocks[b]
                .clone()
                .filter(|&i| class_of(&self.instructions[i].base) == "mma/fma")
                .count()
        };
        (0..self.blocks.len())
            .filter(|&b| self.reach[b][b] && size(b) > 1)
            .max_by_key(|&b| (math(b), size(b), std::cmp::Reverse(b)))
            .or_else(|| (0..self.blocks.len()).max_by_key(|&b| (size(b), std::cmp::Reverse(b))))
            .unwrap_or(0)
    }

    fn add_edge(&mut self, from: usize, to: usize, dep: Dep) {
        if from != to && !self.graph.contains_edge(from as u32, to as u32) {
            self.graph.add_edge(from as u32, to as u32, dep);
        }
    }

    /// Successor blocks of each block (fall-through and branch targets; every block
    /// for an indirect branch).
    fn successors(&self) -> Vec<Vec<usize>> {
        let mut by_label = HashMap::new();
        for (b, range) in self.blocks.iter().enumerate() {
            for label in &self.instructions[range.start].labels {
                by_label.insert(label.as_str(), b);
            }
        }
        let n = self.blocks.len();
        self.blocks
            .iter()
            .enumerate()
            .map(|(b, range)| {
                let last = &self.instructions[range.end - 1];
                let mut out = Vec::new();
                if !last.unconditional_jump() && b + 1 < n {
                    out.push(b + 1);
                }
                if last.ends_block() {
                    match &last.target {
                        Some(t) => match by_label.get(t.as_str()) {
                            Some(&target) => out.push(target),
                            None => out.extend(0..n),
                        },
                        None if matches!(last.base.as_str(), "BRX" | "JMX" | "RET") => {
                            out.extend(0..n)
                        }
                        None => {}
                    }
                }
                out.sort_unstable();
                out.dedup();
                out
            })
            .collect()
    }

    /// Scoreboards each register may still be pending on at each block's entry: the
    /// first `REG_IDS` entries for results not yet written (readers and writers must
    /// wait), the rest for reads not yet done (writers must wait). Bit k: scoreboard k;
    /// bit 7: untracked (covered only by some later instruction's scoreboard).
    fn pending_at_entry(&self, successors: &[Vec<usize>]) -> Vec<Vec<u8>> {
        let n = self.blocks.len();
        let mut entry = vec![vec![0u8; 2 * REG_IDS]; n];
        let mut changed = true;
        while changed {
            changed = false;
            for b in 0..n {
                let mut state = entry[b].clone();
                for i in self.blocks[b].clone() {
                    transfer(&self.instructions[i], &mut state);
                }
                for &s in &successors[b] {
                    for (e, &v) in entry[s].iter_mut().zip(&state) {
                        if *e | v != *e {
                            *e |= v;
                            changed = true;
                        }
                    }
                }
            }
        }
        entry
    }

    /// Order edges of block `b`.
    fn block_edges(&mut self, b: usize, pending_in: &[u8]) {
        let range = self.blocks[b].clone();
        let mut last_def: Vec<Option<usize>> = vec![None; REG_IDS];
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); REG_IDS];
        let mut pending = pending_in.to_vec();
        // Waiters that cleared a pending scoreboard of each register (result half,
        // then read half) since its last definition: whatever depends on that
        // clearing stays after them.
        let mut clears: Vec<Vec<usize>> = vec![Vec::new(); 2 * REG_IDS];
        let mut last_event: [Option<usize>; 6] = [None; 6];
        let mut memory: Vec<usize> = Vec::new();
        let mut variable: Vec<usize> = Vec::new();
        let mut untracked: Vec<usize> = Vec::new();
        let mut edges = Vec::new();
        for i in range.clone() {
            let ins = &self.instructions[i];
            let c = ins.control;
            // The wait happens before the instruction issues.
            if c.wait_mask != 0 {
                for (slot, p) in pending.iter_mut().enumerate() {
                    if *p & c.wait_mask != 0 || *p & 0x80 != 0 {
                        clears[slot].push(i);
                        *p &= !c.wait_mask;
                    }
                }
            }
            // Readers wait for results; writers for results and for pending reads.
            for &r in &ins.uses {
                for &w in &clears[r as usize] {
                    edges.push((w, i, Dep::Coverage));
                }
            }
            for &r in &ins.defs {
                for &w in clears[r as usize]
                    .iter()
                    .chain(&clears[REG_IDS + r as usize])
                {
                    edges.push((w, i, Dep::Coverage));
                }
            }
            for &r in &ins.uses {
                if let Some(d) = last_def[r as usize] {
                    edges.push((d, i, Dep::Raw));
                }
            }
            for &r in &ins.defs {
                let r = r as usize;
                if let Some(d) = last_def[r] {
                    edges.push((d, i, Dep::Waw));
                }
                for &u in &readers[r] {
                    edges.push((u, i, Dep::War));
                }
            }
            // Scoreboard events in order: sets and waits of each barrier.
            for k in 0..6u8 {
                let sets = c.write_barrier == Some(k) || c.read_barrier == Some(k);
                if sets || c.waits_on(k) {
                    if let Some(prev) = last_event[k as usize] {
                        edges.push((prev, i, Dep::Scoreboard));
                    }
                    last_event[k as usize] = Some(i);
                }
            }
            if ins.accesses_memory() {
                for &m in &memory {
                    let other = &self.instructions[m];
                    if conflicts(other, ins) {
                        edges.push((m, i, Dep::Memory));
                    }
                }
                memory.push(i);
            }
            if ins.variable_latency() {
                for &u in &untracked {
                    edges.push((u, i, Dep::Untracked));
                }
                let untracked_result = c.write_barrier.is_none() && !ins.defs.is_empty();
                if untracked_result {
                    for &v in &variable {
                        edges.push((v, i, Dep::Untracked));
                    }
                    untracked.push(i);
                }
                variable.push(i);
            }
            // Update register state.
            for &r in &ins.uses {
                readers[r as usize].push(i);
            }
            for &r in &ins.defs {
                let r = r as usize;
                last_def[r] = Some(i);
                readers[r].clear();
                clears[r].clear();
                clears[REG_IDS + r].clear();
            }
            transfer(ins, &mut pending);
        }
        self.untracked_reads(range, &mut edges);
        for (u, v, dep) in edges {
            self.add_edge(u, v, dep);
        }
    }

    /// Order for reads without a read scoreboard: such an operand is read late, and
    /// ptxas may let the next writer of the register rely on the wait for a later
    /// variable-latency instruction (operands are read in issue order). The reader
    /// then stays before every scoreboard setter whose wait precedes that writer; when
    /// the writer lies in another block, before every later setter of its block.
    fn untracked_reads(&self, range: Range<usize>, edges: &mut Vec<(usize, usize, Dep)>) {
        let b = self.block_of[range.start];
        let sets = |h: usize| {
            let c = self.instructions[h].control;
            let bits =
                c.write_barrier.map_or(0, |k| 1u8 << k) | c.read_barrier.map_or(0, |k| 1u8 << k);
            if self.instructions[h].variable_latency() {
                bits
            } else {
                0
            }
        };
        for u in range.clone() {
            let ins = &self.instructions[u];
            if !ins.variable_latency() || ins.control.read_barrier.is_some() {
                continue;
            }
            for &r in &ins.uses {
                let writer = (u + 1..range.end).find(|&x| self.instructions[x].defs.contains(&r));
                match writer {
                    Some(x) => {
                        for w in u + 1..=x {
                            let mask = self.instructions[w].control.wait_mask;
                            if mask == 0 {
                                continue;
                            }
                            for h in u + 1..w {
                                if sets(h) & mask != 0 {
                                    edges.push((u, h, Dep::Untracked));
                                }
                            }
                        }
                    }
                    None => {
                        let rewritten = (0..self.blocks.len())
                            .any(|o| self.reach[b][o] && self.defined_in[o][r as usize]);
                        if rewritten {
                            for h in u + 1..range.end {
                                if sets(h) != 0 {
                                    edges.push((u, h, Dep::Untracked));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Distance constraints within blocks and at block edges.
    fn latency_constraints(&mut self, successors: &[Vec<usize>]) {
        let stall = |i: usize| u32::from(self.instructions[i].control.stall);
        // Original distance between every fixed-latency producer and its consumers.
        let mut pairs = Vec::new();
        for range in &self.blocks {
            let mut last_def: Vec<Option<usize>> = vec![None; REG_IDS];
            for i in range.clone() {
                let ins = &self.instructions[i];
                for &r in &ins.uses {
                    if let Some(d) = last_def[r as usize]
                        && !self.instructions[d].variable_latency()
                    {
                        let dist: u32 = (d..i).map(stall).sum();
                        let key = Key::of(&self.instructions[d], ins, r);
                        pairs.push((d, i, dist, key));
                    }
                }
                for &r in &ins.defs {
                    last_def[r as usize] = Some(i);
                }
            }
        }
        // Scoreboard set → first wait, and late operand read → next writer.
        let mut edge_setters = Vec::new();
        let mut edge_waiters = Vec::new();
        for (b, range) in self.blocks.iter().enumerate() {
            let mut set_before = 0u8;
            for s in range.clone() {
                let ins = &self.instructions[s];
                let c = ins.control;
                if c.wait_mask & !set_before != 0 {
                    edge_waiters.push(s);
                }
                for k in [c.write_barrier, c.read_barrier].into_iter().flatten() {
                    set_before |= 1 << k;
                    let waiter =
                        (s + 1..range.end).find(|&w| self.instructions[w].control.waits_on(k));
                    match waiter {
                        Some(w) => {
                            let dist: u32 = (s..w).map(stall).sum();
                            pairs.push((s, w, dist, Key::special(ins, "sb")));
                        }
                        None if !successors[b].is_empty() => edge_setters.push(s),
                        None => {}
                    }
                }
                if ins.variable_latency() && c.read_barrier.is_none() {
                    for &r in &ins.uses {
                        let writer =
                            (s + 1..range.end).find(|&x| self.instructions[x].defs.contains(&r));
                        if let Some(x) = writer {
                            let dist: u32 = (s..x).map(stall).sum();
                            pairs.push((s, x, dist, Key::special(ins, "war")));
                        }
                    }
                }
            }
        }
        // Variable-latency results without a scoreboard (HMMA on sm_90): ptxas spaces
        // them by stall counts like fixed-latency ones, so their consumers, later
        // writers of their results and (without a read scoreboard) of their operands
        // keep the original distance up to `UNTRACKED_LATENCY`.
        let mut untracked_pairs = Vec::new();
        for range in &self.blocks {
            for d in range.clone() {
                let p = &self.instructions[d];
                if !untracked(p) {
                    continue;
                }
                let mut dist = 0;
                for c in d + 1..range.end {
                    dist += stall(c - 1);
                    if dist >= UNTRACKED_LATENCY {
                        break;
                    }
                    let q = &self.instructions[c];
                    let raw_or_waw = p
                        .defs
                        .iter()
                        .any(|r| q.uses.contains(r) || q.defs.contains(r));
                    let war = p.control.read_barrier.is_none()
                        && p.uses.iter().any(|r| q.defs.contains(r));
                    if raw_or_waw || war {
                        untracked_pairs.push(Distance {
                            producer: d,
                            consumer: c,
                            cycles: dist,
                        });
                    }
                }
            }
        }
        let mut observed: BTreeMap<Key, u32> = BTreeMap::new();
        for &(_, _, dist, ref key) in &pairs {
            let e = observed.entry(key.clone()).or_insert(dist);
            *e = (*e).min(dist);
        }
        let mut distances = Vec::new();
        for (d, i, dist, key) in pairs {
            let needed = latency::required(&key, observed.get(&key).copied(), dist);
            if needed > 0 {
                distances.push(Distance {
                    producer: d,
                    consumer: i,
                    cycles: needed,
                });
            }
        }
        distances.extend(untracked_pairs.into_iter().filter(|d| d.cycles > 0));
        // One constraint per pair: the largest.
        distances.sort_by_key(|d| (d.producer, d.consumer, std::cmp::Reverse(d.cycles)));
        distances.dedup_by_key(|d| (d.producer, d.consumer));

        // Block edges: fixed-latency definitions live at the end of a block, and
        // uses at the start of a block of registers such definitions may reach.
        let cap = latency::LONGEST_FIXED;
        // Per register: the cycles a definition live out of the block may still need.
        let mut hot_out: Vec<Vec<u32>> = Vec::new();
        let mut to_end = Vec::new();
        for (b, range) in self.blocks.iter().enumerate() {
            let mut hot = vec![0u32; REG_IDS];
            let mut seen = vec![false; REG_IDS];
            let mut suffix = 0;
            for i in range.clone().rev() {
                suffix += stall(i);
                let ins = &self.instructions[i];
                let mut live_out = false;
                for &r in &ins.defs {
                    if !seen[r as usize] {
                        seen[r as usize] = true;
                        live_out = true;
                        if !ins.variable_latency() && suffix < cap {
                            hot[r as usize] = cap;
                        }
                        if untracked(ins) && suffix < UNTRACKED_LATENCY {
                            hot[r as usize] = UNTRACKED_LATENCY;
                        }
                    }
                }
                if live_out && !ins.variable_latency() && !successors[b].is_empty() {
                    to_end.push(EdgeDistance {
                        instruction: i,
                        cycles: suffix.min(cap),
                    });
                }
                if live_out && untracked(ins) && !successors[b].is_empty() {
                    to_end.push(EdgeDistance {
                        instruction: i,
                        cycles: suffix.min(UNTRACKED_LATENCY),
                    });
                }
            }
            hot_out.push(hot);
        }
        let mut hot_in = vec![vec![0u32; REG_IDS]; self.blocks.len()];
        for (b, succ) in successors.iter().enumerate() {
            for &s in succ {
                for r in 0..REG_IDS {
                    hot_in[s][r] = hot_in[s][r].max(hot_out[b][r]);
                }
            }
        }
        let mut from_start = Vec::new();
        for (b, range) in self.blocks.iter().enumerate() {
            let mut defined = vec![false; REG_IDS];
            let mut prefix = 0;
            for i in range.clone() {
                let ins = &self.instructions[i];
                let live_in_need = ins
                    .uses
                    .iter()
                    .filter(|&&r| !defined[r as usize])
                    .map(|&r| hot_in[b][r as usize])
                    .max()
                    .unwrap_or(0);
                if live_in_need > 0 && prefix > 0 {
                    from_start.push(EdgeDistance {
                        instruction: i,
                        cycles: prefix.min(live_in_need),
                    });
                }
                for &r in &ins.defs {
                    defined[r as usize] = true;
                }
                prefix += stall(i);
            }
        }
        for range in &self.blocks {
            for &s in edge_setters.iter().filter(|&&s| range.contains(&s)) {
                let suffix: u32 = (s..range.end).map(stall).sum();
                to_end.push(EdgeDistance {
                    instruction: s,
                    cycles: suffix.min(cap),
                });
            }
            for &w in edge_waiters.iter().filter(|&&w| range.contains(&w)) {
                let prefix: u32 = (range.start..w).map(stall).sum();
                if prefix > 0 {
                    from_start.push(EdgeDistance {
                        instruction: w,
                        cycles: prefix.min(cap),
                    });
                }
            }
        }
        let mut distances_of = vec![Vec::new(); self.len()];
        for (k, d) in distances.iter().enumerate() {
            distances_of[d.producer].push(k);
            distances_of[d.consumer].push(k);
        }
        self.distances = distances;
        self.distances_of = distances_of;
        self.to_block_end = to_end;
        self.from_block_start = from_start;
    }
}

/// Cycles an untracked variable-latency result (no scoreboard) is assumed to take at
/// most: above sm_90's HMMA latency (27 cycles, `shared/REFERENCE.md`).
pub const UNTRACKED_LATENCY: u32 = 40;

/// A variable-latency instruction whose result has no scoreboard: ptxas times its
/// consumers by stall counts.
fn untracked(ins: &Instruction) -> bool {
    ins.variable_latency() && ins.control.write_barrier.is_none() && !ins.defs.is_empty()
}

/// `reach[a][b]`: a path of at least one edge leads from block a to block b.
fn reachability(successors: &[Vec<usize>]) -> Vec<Vec<bool>> {
    let n = successors.len();
    (0..n)
        .map(|a| {
            let mut seen = vec![false; n];
            let mut stack: Vec<usize> = successors[a].clone();
            while let Some(b) = stack.pop() {
                if !seen[b] {
                    seen[b] = true;
                    stack.extend(&successors[b]);
                }
            }
            seen
        })
        .collect()
}

/// Splits at labels (branch targets) and after control flow.
fn split_blocks(instructions: &[Instruction]) -> Vec<Range<usize>> {
    let mut blocks = Vec::new();
    let mut start = 0;
    for (i, ins) in instructions.iter().enumerate() {
        if i > start && !ins.labels.is_empty() {
            blocks.push(start..i);
            start = i;
        }
        if ins.ends_block() {
            blocks.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < instructions.len() {
        blocks.push(start..instructions.len());
    }
    blocks
}

/// Pending scoreboards after `ins`: its wait clears, its barriers set. A
/// variable-latency instruction without a write scoreboard leaves its results
/// untracked; one without a read scoreboard leaves its register reads untracked (its
/// operands are read late, and ptxas may rely on a later instruction's scoreboard).
fn transfer(ins: &Instruction, pending: &mut [u8]) {
    let c = ins.control;
    if c.wait_mask != 0 {
        for p in pending.iter_mut() {
            *p &= !c.wait_mask | 0x80;
        }
    }
    // A new definition replaces whatever was pending on the register.
    for &r in &ins.defs {
        pending[r as usize] = 0;
        pending[REG_IDS + r as usize] = 0;
    }
    let result = match c.write_barrier {
        Some(k) => 1 << k,
        None if ins.variable_latency() => 0x80,
        None => 0,
    };
    for &r in &ins.defs {
        pending[r as usize] |= result;
    }
    let read = match c.read_barrier {
        Some(k) => 1 << k,
        None if ins.variable_latency() => 0x80,
        None => 0,
    };
    for &r in &ins.uses {
        pending[REG_IDS + r as usize] |= read;
    }
}

/// Whether two memory accesses must keep their order.
fn conflicts(a: &Instruction, b: &Instruction) -> bool {
    let hits = |w: Option<_>, other: &Instruction| {
        w.is_some_and(|s: crate::decode::instr::Space| {
            [other.reads, other.writes]
                .into_iter()
                .flatten()
                .any(|o| o.may_alias(s))
        })
    };
    hits(a.writes, b) || hits(b.writes, a)
}
