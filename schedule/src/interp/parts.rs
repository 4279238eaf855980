//! The interpreter's warp-specialized parts (`Stmt::Concurrent`): each part's loop nest
//! flattened into a program of its own, the parts taking turns until each finishes or
//! waits on a phase that has not completed; all waiting is a deadlock.

use super::*;

impl Block<'_> {
    /// `Stmt::Concurrent`: the parts take turns (see the module docs).
    pub(super) fn concurrent(
        &mut self,
        parts: &[Stmt],
        active: &[bool],
        inputs: &Inputs,
        out: &mut [f32],
        writes: &mut [u32],
    ) -> Result<(), InterpError> {
        let mut programs: Vec<Program> = parts
            .iter()
            .map(|part| Program::new(std::slice::from_ref(part), active.to_vec()))
            .collect();
        loop {
            let mut progressed = false;
            for p in programs.iter_mut().filter(|p| !p.done()) {
                progressed |= self.run_part(p, inputs, out, writes)?;
            }
            let Some(waiting) = programs.iter().find(|p| !p.done()) else {
                return Ok(());
            };
            if !progressed {
                // Every unfinished part waits: run the first one's wait for its error.
                let Op::Leaf(wait) = waiting.ops[waiting.pc] else {
                    unreachable!("a part stops only at a wait")
                };
                let mask = waiting.mask().to_vec();
                self.exec(std::slice::from_ref(wait), &mask, inputs, out, writes)?;
                unreachable!("a wait that is not ready fails");
            }
        }
    }

    /// Runs part `p` until it finishes or reaches a wait that is not ready; whether it
    /// took a step.
    pub(super) fn run_part(
        &mut self,
        p: &mut Program,
        inputs: &Inputs,
        out: &mut [f32],
        writes: &mut [u32],
    ) -> Result<bool, InterpError> {
        let mut stepped = false;
        while !p.done() {
            match p.ops[p.pc] {
                Op::Leaf(stmt) => {
                    if let Stmt::MbarrierWait { barrier, .. } = stmt {
                        for t in (0..self.threads).filter(|&t| p.mask()[t]) {
                            let b = self.barrier(barrier, t)?;
                            if !self.barriers[b].ready(t) {
                                return Ok(stepped);
                            }
                        }
                    }
                    let mask = p.mask().to_vec();
                    self.exec(std::slice::from_ref(stmt), &mask, inputs, out, writes)?;
                    p.pc += 1;
                }
                Op::Enter { conds, end } => {
                    let inner: Vec<bool> = (0..self.threads)
                        .map(|t| p.mask()[t] && self.holds(conds, t))
                        .collect();
                    if inner.contains(&true) {
                        p.masks.push(inner);
                        p.pc += 1;
                    } else {
                        p.pc = end;
                    }
                }
                Op::Leave => {
                    p.masks.pop();
                    p.pc += 1;
                }
                Op::Loop { var, extent, end } => {
                    if extent == 0 {
                        p.pc = end;
                    } else {
                        p.counters.push(0);
                        for env in &mut self.env {
                            env[var.0] = 0;
                        }
                        p.pc += 1;
                    }
                }
                Op::Next { var, extent, start } => {
                    let i = p.counters.last_mut().expect("inside a loop");
                    *i += 1;
                    if *i < extent {
                        let i = *i;
                        for env in &mut self.env {
                            env[var.0] = i;
                        }
                        p.pc = start;
                    } else {
                        p.counters.pop();
                        p.pc += 1;
                    }
                }
                Op::Scope => {
                    p.saved.push(self.env.clone());
                    p.pc += 1;
                }
                Op::Unscope => {
                    // Only this part's threads: the others moved on meanwhile.
                    let saved = p.saved.pop().expect("inside a block");
                    for t in (0..self.threads).filter(|&t| p.mask()[t]) {
                        self.env[t] = saved[t].clone();
                    }
                    p.pc += 1;
                }
            }
            stepped = true;
        }
        Ok(stepped)
    }
}

/// Whether `stmt` is or holds an mbarrier wait.
pub(super) fn waits(stmt: &Stmt) -> bool {
    let mut found = false;
    Stmt::walk(std::slice::from_ref(stmt), &mut |s| {
        found |= matches!(s, Stmt::MbarrierWait { .. })
    });
    found
}

pub(super) fn flatten<'k>(body: &'k [Stmt], ops: &mut Vec<Op<'k>>) {
    for stmt in body {
        match stmt {
            _ if !waits(stmt) => ops.push(Op::Leaf(stmt)),
            Stmt::If { conds, body } => {
                let at = ops.len();
                ops.push(Op::Leave);
                flatten(body, ops);
                ops.push(Op::Leave);
                ops[at] = Op::Enter {
                    conds,
                    end: ops.len(),
                };
            }
            Stmt::For {
                var, extent, body, ..
            } => {
                let at = ops.len();
                ops.push(Op::Leave);
                flatten(body, ops);
                ops.push(Op::Next {
                    var: *var,
                    extent: *extent,
                    start: at + 1,
                });
                ops[at] = Op::Loop {
                    var: *var,
                    extent: *extent,
                    end: ops.len(),
                };
            }
            Stmt::Block { body } => {
                ops.push(Op::Scope);
                flatten(body, ops);
                ops.push(Op::Unscope);
            }
            _ => ops.push(Op::Leaf(stmt)),
        }
    }
}
