//! CUDA C code generation: prints a lowered kernel as readable source.
//!
//! The output is deterministic (the same kernel gives byte-identical text) and starts
//! with a comment that names the task, carries the state's JSON and the launch
//! configuration (including, for split-K kernels, that the output must be zeroed before
//! each launch), so that a `.cu` file found on disk can be replayed.

use crate::ir::{Cond, Expr, Kernel, Scope, Stmt};
use std::fmt::Write;

/// Generates the CUDA C source of `kernel`; `header` lines become leading comments.
pub fn cuda_source(kernel: &Kernel, header: &[String]) -> String {
    let mut out = String::new();
    for line in header {
        let _ = writeln!(out, "// {line}");
    }
    let l = &kernel.launch;
    let _ = writeln!(
        out,
        "// launch: grid ({}, 1, 1), block ({}, 1, 1), dynamic shared memory {} bytes",
        l.grid, l.block, l.dynamic_shared_bytes
    );
    if l.zero_output {
        let _ = writeln!(
            out,
            "// split-K: {} blocks add into each output element; zero `out` before every launch",
            kernel.split_k
        );
    }
    let p = &kernel.params;
    let mut params: Vec<String> = p
        .inputs
        .iter()
        .map(|name| format!("const float* __restrict__ {name}"))
        .collect();
    if p.bias {
        params.push("const float* __restrict__ bias".to_string());
    }
    params.push("float* __restrict__ out".to_string());
    let _ = writeln!(
        out,
        "extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{",
        l.block,
        kernel.name,
        params.join(", ")
    );
    let _ = writeln!(out, "  extern __shared__ float4 shared_pool[];");
    for (i, name) in p.inputs.iter().enumerate() {
        let _ = writeln!(
            out,
            "  float* {name}_sh = reinterpret_cast<float*>(shared_pool) + {};",
            kernel.tile_offsets[i]
        );
    }
    let _ = writeln!(out, "  float acc[{}];", kernel.accumulators);
    let printer = Printer { kernel };
    for stmt in &kernel.body {
        printer.stmt(&mut out, stmt, 1);
    }
    out.push_str("}\n");
    out
}

struct Printer<'a> {
    kernel: &'a Kernel,
}

/// Operator precedence levels for parenthesization.
const ADD: u8 = 1;
const MUL: u8 = 2;

impl Printer<'_> {
    fn scope(&self) -> &Scope {
        &self.kernel.scope
    }

    fn expr(&self, e: &Expr) -> String {
        self.expr_in(e, 0)
    }

    /// Prints `e` inside an operator of precedence `outer`.
    fn expr_in(&self, e: &Expr, outer: u8) -> String {
        let (text, own) = match e {
            Expr::Const(c) => (c.to_string(), u8::MAX),
            Expr::Var(v) => (self.scope().vars[v.0].name.clone(), u8::MAX),
            Expr::BlockIdx => ("(int)blockIdx.x".to_string(), u8::MAX),
            Expr::ThreadIdx => ("(int)threadIdx.x".to_string(), u8::MAX),
            Expr::Add(a, b) => {
                let rhs = match &**b {
                    Expr::Const(c) if *c < 0 => format!(" - {}", -c),
                    b => format!(" + {}", self.expr_in(b, ADD)),
                };
                (format!("{}{rhs}", self.expr_in(a, ADD)), ADD)
            }
            Expr::Mul(a, c) => (format!("{} * {c}", self.expr_in(a, MUL)), MUL),
            Expr::Div(a, c) => (format!("{} / {c}", self.expr_in(a, MUL)), MUL),
            Expr::Rem(a, c) => (format!("{} % {c}", self.expr_in(a, MUL)), MUL),
        };
        // Division and remainder are not associative: parenthesize a product or
        // quotient that appears as their left operand only when it is not the same op.
        if own < outer || (own == MUL && outer == MUL && !matches!(e, Expr::Mul(..))) {
            format!("({text})")
        } else {
            text
        }
    }

    fn conds(&self, conds: &[Cond]) -> String {
        let mut parts = Vec::new();
        for c in conds {
            let e = self.expr(&c.expr);
            if let Some(lo) = c.lo {
                parts.push(format!("{lo} <= {e}"));
            }
            if let Some(hi) = c.hi {
                parts.push(format!("{e} < {hi}"));
            }
        }
        parts.join(" && ")
    }

    /// Like `conds`, but a test `x < 1` of a non-negative `x` (the split-K bias's
    /// "chunk 0") reads `x == 0`.
    fn chunk_conds(&self, conds: &[Cond]) -> String {
        let parts: Vec<String> = conds
            .iter()
            .map(|c| match (c.lo, c.hi) {
                (None, Some(1)) if self.scope().range(&c.expr).0 >= 0 => {
                    format!("{} == 0", self.expr(&c.expr))
                }
                _ => self.conds(std::slice::from_ref(c)),
            })
            .collect();
        parts.join(" && ")
    }

    /// The value a fetch loads: `valid ? load : zero`, or the load alone when always
    /// valid (one float, or one `float{w}` vector).
    fn fetch_value(&self, stmt: &Stmt) -> String {
        let Stmt::Fetch {
            input,
            global,
            valid,
            width,
            ..
        } = stmt
        else {
            unreachable!("a fetch statement");
        };
        let name = self.kernel.params.inputs[*input];
        let w = *width;
        let (load, zero) = if w == 1 {
            (format!("{name}[{}]", self.expr(global)), "0.0f".to_string())
        } else {
            (
                format!(
                    "*reinterpret_cast<const float{w}*>({name} + {})",
                    self.expr_in(global, ADD)
                ),
                format!("make_float{w}({})", vec!["0.0f"; w as usize].join(", ")),
            )
        };
        if valid.is_empty() {
            load
        } else {
            format!("({}) ? {load} : {zero}", self.conds(valid))
        }
    }

    /// Whether a fetch's vector is stored component by component, `step` floats apart
    /// (a shared layout whose contiguous dimension is not the vector's, or whose padded
    /// rows are not aligned to the vector).
    fn scattered(stmt: &Stmt) -> bool {
        matches!(stmt, Stmt::Fetch { width, vector_store, .. } if *width > 1 && !*vector_store)
    }

    /// Stores `value` (a float, or a vector when not scattered) where the fetch puts it.
    fn fetch_store(&self, out: &mut String, stmt: &Stmt, pad: &str, value: &str) {
        let Stmt::Fetch {
            input,
            shared,
            width,
            step,
            ..
        } = stmt
        else {
            unreachable!("a fetch statement");
        };
        let name = self.kernel.params.inputs[*input];
        let w = *width;
        if Self::scattered(stmt) {
            for (j, component) in ["x", "y", "z", "w"].iter().take(w as usize).enumerate() {
                let at = self
                    .scope()
                    .add(shared.clone(), Expr::Const(j as i64 * step));
                let _ = writeln!(
                    out,
                    "{pad}{name}_sh[{}] = {value}.{component};",
                    self.expr(&at)
                );
            }
        } else if w == 1 {
            let _ = writeln!(out, "{pad}{name}_sh[{}] = {value};", self.expr(shared));
        } else {
            let _ = writeln!(
                out,
                "{pad}*reinterpret_cast<float{w}*>({name}_sh + {}) = {value};",
                self.expr_in(shared, ADD)
            );
        }
    }

    fn stmt(&self, out: &mut String, stmt: &Stmt, depth: usize) {
        let pad = "  ".repeat(depth);
        match stmt {
            Stmt::Let { var, value } => {
                let name = &self.scope().vars[var.0].name;
                let _ = writeln!(out, "{pad}const int {name} = {};", self.expr(value));
            }
            Stmt::For {
                var,
                extent,
                unroll,
                body,
            } if self.kernel.prefetch && contains_sync(body) => {
                let name = &self.scope().vars[var.0].name;
                debug_assert!(!*unroll);
                self.prefetch_loop(out, name, *extent, body, depth);
            }
            Stmt::For {
                var,
                extent,
                unroll,
                body,
            } => {
                let name = &self.scope().vars[var.0].name;
                let pragma = if *unroll {
                    "#pragma unroll"
                } else {
                    "#pragma unroll 1"
                };
                let _ = writeln!(out, "{pad}{pragma}");
                let _ = writeln!(
                    out,
                    "{pad}for (int {name} = 0; {name} < {extent}; ++{name}) {{"
                );
                for s in body {
                    self.stmt(out, s, depth + 1);
                }
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::If { conds, body } => {
                let _ = writeln!(out, "{pad}if ({}) {{", self.conds(conds));
                for s in body {
                    self.stmt(out, s, depth + 1);
                }
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::Sync => {
                let _ = writeln!(out, "{pad}__syncthreads();");
            }
            Stmt::ZeroAcc => {
                let n = self.kernel.accumulators;
                let _ = writeln!(out, "{pad}#pragma unroll");
                let _ = writeln!(out, "{pad}for (int i = 0; i < {n}; ++i) acc[i] = 0.0f;");
            }
            Stmt::Fetch { input, width, .. } => {
                let value = self.fetch_value(stmt);
                if Self::scattered(stmt) {
                    let name = self.kernel.params.inputs[*input];
                    let _ = writeln!(out, "{pad}{{");
                    let _ = writeln!(out, "{pad}  const float{width} {name}_f = {value};");
                    self.fetch_store(out, stmt, &format!("{pad}  "), &format!("{name}_f"));
                    let _ = writeln!(out, "{pad}}}");
                } else {
                    self.fetch_store(out, stmt, &pad, &value);
                }
            }
            Stmt::Fma { acc, a, b } => {
                let [na, nb] = self.kernel.params.inputs;
                let _ = writeln!(
                    out,
                    "{pad}acc[{}] += {na}_sh[{}] * {nb}_sh[{}];",
                    self.expr(acc),
                    self.expr(a),
                    self.expr(b)
                );
            }
            Stmt::Store {
                acc,
                out: index,
                bias,
                bias_when,
                valid,
                atomic,
            } => {
                let mut value = format!("acc[{}]", self.expr(acc));
                if let Some(b) = bias {
                    let load = format!("bias[{}]", self.expr(b));
                    if bias_when.is_empty() {
                        value = format!("{value} + {load}");
                    } else {
                        let when = self.chunk_conds(bias_when);
                        value = format!("{value} + ({when} ? {load} : 0.0f)");
                    }
                }
                if self.kernel.params.relu {
                    value = format!("fmaxf({value}, 0.0f)");
                }
                let store = if *atomic {
                    format!("atomicAdd(&out[{}], {value});", self.expr(index))
                } else {
                    format!("out[{}] = {value};", self.expr(index))
                };
                if valid.is_empty() {
                    let _ = writeln!(out, "{pad}{store}");
                } else {
                    let _ = writeln!(out, "{pad}if ({}) {store}", self.conds(valid));
                }
            }
        }
    }
}

/// What a fetch statement does in a prefetching stage loop.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Global memory into the prefetch registers.
    Load,
    /// Prefetch registers into shared memory.
    Store,
}

fn contains_sync(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match s {
        Stmt::Sync => true,
        Stmt::If { body, .. } => contains_sync(body),
        _ => false,
    })
}

fn contains_fetch(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match s {
        Stmt::Fetch { .. } => true,
        Stmt::If { body, .. } | Stmt::For { body, .. } => contains_fetch(body),
        _ => false,
    })
}

/// The fetch statements of a stage (before its first barrier), in emission order:
/// (vector width, register slots) each.
fn fetch_slots(stmts: &[Stmt], loops: i64, out: &mut Vec<(u32, i64)>) {
    for s in stmts {
        match s {
            Stmt::Sync => return,
            Stmt::Fetch { width, .. } => out.push((*width, loops)),
            Stmt::For { extent, body, .. } if contains_fetch(body) => {
                fetch_slots(body, loops * extent, out);
            }
            Stmt::If { body, .. } if contains_fetch(body) || contains_sync(body) => {
                fetch_slots(body, loops, out);
            }
            _ => {}
        }
    }
}

impl Printer<'_> {
    /// The stage loop with register prefetch: stage 0 is loaded into registers before
    /// the loop; each iteration stores the registers to shared memory, synchronizes,
    /// issues the next stage's loads into the registers, then computes.
    fn prefetch_loop(
        &self,
        out: &mut String,
        name: &str,
        extent: i64,
        body: &[Stmt],
        depth: usize,
    ) {
        let pad = "  ".repeat(depth);
        let mut slots = Vec::new();
        fetch_slots(body, 1, &mut slots);
        for (k, (w, n)) in slots.iter().enumerate() {
            let ty = if *w == 1 {
                "float".to_string()
            } else {
                format!("float{w}")
            };
            let _ = writeln!(out, "{pad}{ty} pf{k}[{n}];");
        }
        let _ = writeln!(out, "{pad}{{");
        let _ = writeln!(out, "{pad}  const int {name} = 0;");
        self.phase(out, body, depth + 1, Phase::Load, &mut Vec::new(), &mut 0);
        let _ = writeln!(out, "{pad}}}");
        let _ = writeln!(out, "{pad}#pragma unroll 1");
        let _ = writeln!(
            out,
            "{pad}for (int {name} = 0; {name} < {extent}; ++{name}) {{"
        );
        self.stage_with_prefetch(out, body, body, depth + 1, (name, extent), &mut 0);
        let _ = writeln!(out, "{pad}}}");
    }

    /// One iteration: stores from the registers, the barrier, the next stage's loads,
    /// and the rest of the stage as it is.
    fn stage_with_prefetch(
        &self,
        out: &mut String,
        stmts: &[Stmt],
        whole: &[Stmt],
        depth: usize,
        (name, extent): (&str, i64),
        counter: &mut usize,
    ) {
        let pad = "  ".repeat(depth);
        let mut computing = false;
        for s in stmts {
            if computing {
                self.stmt(out, s, depth);
                continue;
            }
            match s {
                Stmt::If { conds, body } if contains_sync(body) => {
                    let _ = writeln!(out, "{pad}if ({}) {{", self.conds(conds));
                    self.stage_with_prefetch(out, body, whole, depth + 1, (name, extent), counter);
                    let _ = writeln!(out, "{pad}}}");
                }
                Stmt::Sync => {
                    let _ = writeln!(out, "{pad}__syncthreads();");
                    let _ = writeln!(out, "{pad}if ({name} + 1 < {extent}) {{");
                    let _ = writeln!(out, "{pad}  const int {name}_next = {name} + 1;");
                    let _ = writeln!(out, "{pad}  {{");
                    let _ = writeln!(out, "{pad}    const int {name} = {name}_next;");
                    self.phase(out, whole, depth + 2, Phase::Load, &mut Vec::new(), &mut 0);
                    let _ = writeln!(out, "{pad}  }}");
                    let _ = writeln!(out, "{pad}}}");
                    computing = true;
                }
                _ => self.phase(
                    out,
                    std::slice::from_ref(s),
                    depth,
                    Phase::Store,
                    &mut Vec::new(),
                    counter,
                ),
            }
        }
    }

    /// The fetch part of a stage (up to its first barrier) in one phase; `loops` are
    /// the enclosing fetch loops (name, extent), `counter` numbers fetch statements.
    fn phase(
        &self,
        out: &mut String,
        stmts: &[Stmt],
        depth: usize,
        phase: Phase,
        loops: &mut Vec<(String, i64)>,
        counter: &mut usize,
    ) {
        let pad = "  ".repeat(depth);
        for s in stmts {
            match s {
                Stmt::Sync => return,
                Stmt::Let { .. } => self.stmt(out, s, depth),
                Stmt::Fetch { .. } => {
                    let slot = loops.iter().fold(String::from("0"), |acc, (v, e)| {
                        if acc == "0" {
                            v.clone()
                        } else {
                            format!("({acc}) * {e} + {v}")
                        }
                    });
                    self.prefetch_fetch(out, s, depth, phase, &format!("pf{}[{slot}]", *counter));
                    *counter += 1;
                }
                Stmt::For {
                    var,
                    extent,
                    unroll,
                    body,
                } if contains_fetch(body) => {
                    let name = self.scope().vars[var.0].name.clone();
                    let pragma = if *unroll {
                        "#pragma unroll"
                    } else {
                        "#pragma unroll 1"
                    };
                    let _ = writeln!(out, "{pad}{pragma}");
                    let _ = writeln!(
                        out,
                        "{pad}for (int {name} = 0; {name} < {extent}; ++{name}) {{"
                    );
                    loops.push((name, *extent));
                    self.phase(out, body, depth + 1, phase, loops, counter);
                    loops.pop();
                    let _ = writeln!(out, "{pad}}}");
                }
                Stmt::If { conds, body } if contains_fetch(body) || contains_sync(body) => {
                    let _ = writeln!(out, "{pad}if ({}) {{", self.conds(conds));
                    self.phase(out, body, depth + 1, phase, loops, counter);
                    let _ = writeln!(out, "{pad}}}");
                }
                _ if phase == Phase::Store => self.stmt(out, s, depth),
                _ => {}
            }
        }
    }

    /// One fetch statement against its prefetch register `reg`.
    fn prefetch_fetch(&self, out: &mut String, stmt: &Stmt, depth: usize, phase: Phase, reg: &str) {
        let pad = "  ".repeat(depth);
        match phase {
            Phase::Load => {
                let _ = writeln!(out, "{pad}{reg} = {};", self.fetch_value(stmt));
            }
            Phase::Store => self.fetch_store(out, stmt, &pad, reg),
        }
    }
}
