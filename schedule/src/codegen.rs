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

    /// A fetch whose vector is loaded whole from global memory and stored component by
    /// component, `step` floats apart (a shared layout whose contiguous dimension is not
    /// the vector's, or whose padded rows are not aligned to the vector).
    fn scattered_fetch(&self, out: &mut String, stmt: &Stmt, depth: usize) {
        let Stmt::Fetch {
            input,
            shared,
            global,
            valid,
            width,
            step,
            ..
        } = stmt
        else {
            return;
        };
        let pad = "  ".repeat(depth);
        let name = self.kernel.params.inputs[*input];
        let w = *width;
        let load = format!(
            "*reinterpret_cast<const float{w}*>({name} + {})",
            self.expr_in(global, ADD)
        );
        let value = if valid.is_empty() {
            load
        } else {
            let zero = format!("make_float{w}({})", vec!["0.0f"; w as usize].join(", "));
            format!("({}) ? {load} : {zero}", self.conds(valid))
        };
        let _ = writeln!(out, "{pad}{{");
        let _ = writeln!(out, "{pad}  const float{w} {name}_f = {value};");
        for (j, component) in ["x", "y", "z", "w"].iter().take(w as usize).enumerate() {
            let at = self
                .scope()
                .add(shared.clone(), Expr::Const(j as i64 * step));
            let _ = writeln!(
                out,
                "{pad}  {name}_sh[{}] = {name}_f.{component};",
                self.expr(&at)
            );
        }
        let _ = writeln!(out, "{pad}}}");
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
            Stmt::Fetch {
                input,
                shared,
                global,
                valid,
                width,
                vector_store,
                ..
            } => {
                let name = self.kernel.params.inputs[*input];
                if *width > 1 && !*vector_store {
                    self.scattered_fetch(out, stmt, depth);
                    return;
                }
                let (s, g) = (self.expr(shared), self.expr(global));
                let (lhs, load, zero) = match width {
                    1 => (
                        format!("{name}_sh[{s}]"),
                        format!("{name}[{g}]"),
                        "0.0f".to_string(),
                    ),
                    w => (
                        format!(
                            "*reinterpret_cast<float{w}*>({name}_sh + {})",
                            self.expr_in(shared, ADD)
                        ),
                        format!(
                            "*reinterpret_cast<const float{w}*>({name} + {})",
                            self.expr_in(global, ADD)
                        ),
                        format!("make_float{w}({})", vec!["0.0f"; *w as usize].join(", ")),
                    ),
                };
                if valid.is_empty() {
                    let _ = writeln!(out, "{pad}{lhs} = {load};");
                } else {
                    let _ = writeln!(
                        out,
                        "{pad}{lhs} = ({}) ? {load} : {zero};",
                        self.conds(valid)
                    );
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
