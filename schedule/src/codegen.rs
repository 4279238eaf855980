//! CUDA C code generation: prints a lowered kernel as readable source.
//!
//! The output is deterministic (the same kernel gives byte-identical text) and starts
//! with a comment that names the task, carries the state's JSON and the launch
//! configuration (including, for split-K kernels, that the output must be zeroed before
//! each launch), so that a `.cu` file found on disk can be replayed.
//!
//! It only prints: every transform (register prefetch included, see `prefetch`) is
//! already in the loop nest, so what the CPU interpreter runs is what is compiled. A
//! register array `array` is named `pf{array}`.

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
    Printer { kernel }.body(&mut out, &kernel.body, 1);
    out.push_str("}\n");
    out
}

struct Printer<'a> {
    kernel: &'a Kernel,
}

/// Where a fetched vector goes in an input's shared tile (a `Fetch`'s or a
/// `RegisterStore`'s destination).
#[derive(Clone, Copy)]
struct SharedWrite<'a> {
    input: usize,
    shared: &'a Expr,
    width: u32,
    step: i64,
    vector_store: bool,
}

impl SharedWrite<'_> {
    /// Whether the vector is stored component by component.
    fn scattered(&self) -> bool {
        self.width > 1 && !self.vector_store
    }
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

    /// The value a global read loads: `valid ? load : zero`, or the load alone when
    /// always valid (one float, or one `float{w}` vector).
    fn global_value(&self, input: usize, global: &Expr, valid: &[Cond], width: u32) -> String {
        let name = self.kernel.params.inputs[input];
        let w = width;
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

    /// Stores `value` (a float, or a `float{width}` vector) at `shared` in an input's
    /// tile: as one store, or component by component `step` floats apart when
    /// `scattered` (a shared layout whose contiguous dimension is not the vector's, or
    /// whose padded rows are not aligned to the vector).
    fn shared_store(&self, out: &mut String, pad: &str, to: SharedWrite, value: &str) {
        let name = self.kernel.params.inputs[to.input];
        let w = to.width;
        if to.scattered() {
            for (j, component) in ["x", "y", "z", "w"].iter().take(w as usize).enumerate() {
                let at = self
                    .scope()
                    .add(to.shared.clone(), Expr::Const(j as i64 * to.step));
                let _ = writeln!(
                    out,
                    "{pad}{name}_sh[{}] = {value}.{component};",
                    self.expr(&at)
                );
            }
        } else if w == 1 {
            let _ = writeln!(out, "{pad}{name}_sh[{}] = {value};", self.expr(to.shared));
        } else {
            let _ = writeln!(
                out,
                "{pad}*reinterpret_cast<float{w}*>({name}_sh + {}) = {value};",
                self.expr_in(to.shared, ADD)
            );
        }
    }

    /// The statements of a body, each at `depth`.
    fn body(&self, out: &mut String, body: &[Stmt], depth: usize) {
        for s in body {
            self.stmt(out, s, depth);
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
                self.body(out, body, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::If { conds, body } => {
                let _ = writeln!(out, "{pad}if ({}) {{", self.conds(conds));
                self.body(out, body, depth + 1);
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
                step,
                vector_store,
            } => {
                let value = self.global_value(*input, global, valid, *width);
                let to = SharedWrite {
                    input: *input,
                    shared,
                    width: *width,
                    step: *step,
                    vector_store: *vector_store,
                };
                if to.scattered() {
                    // The vector is loaded once, then stored component by component.
                    let name = self.kernel.params.inputs[*input];
                    let _ = writeln!(out, "{pad}{{");
                    let _ = writeln!(out, "{pad}  const float{width} {name}_f = {value};");
                    self.shared_store(out, &format!("{pad}  "), to, &format!("{name}_f"));
                    let _ = writeln!(out, "{pad}}}");
                } else {
                    self.shared_store(out, &pad, to, &value);
                }
            }
            Stmt::Registers { array, width, len } => {
                let ty = if *width == 1 {
                    "float".to_string()
                } else {
                    format!("float{width}")
                };
                let _ = writeln!(out, "{pad}{ty} pf{array}[{len}];");
            }
            Stmt::RegisterLoad {
                array,
                slot,
                input,
                global,
                valid,
                width,
            } => {
                let value = self.global_value(*input, global, valid, *width);
                let _ = writeln!(out, "{pad}pf{array}[{}] = {value};", self.expr(slot));
            }
            Stmt::RegisterStore {
                array,
                slot,
                input,
                shared,
                width,
                step,
                vector_store,
            } => {
                let to = SharedWrite {
                    input: *input,
                    shared,
                    width: *width,
                    step: *step,
                    vector_store: *vector_store,
                };
                let value = format!("pf{array}[{}]", self.expr(slot));
                self.shared_store(out, &pad, to, &value);
            }
            Stmt::Block { body } => {
                let _ = writeln!(out, "{pad}{{");
                self.body(out, body, depth + 1);
                let _ = writeln!(out, "{pad}}}");
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
