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

use crate::atom::fragment::{self, lane_c};
use crate::atom::wgmma::{self, WgmmaAtom};
use crate::atom::{
    FillCopy, Index, Ldmatrix, MmaAtom, Numbers, OperandLayout, SharedTileLayout, SpanLayout, Term,
    tma,
};
use crate::ir::{
    Cond, Expr, GlobalRead, Kernel, Param, Role, Scope, SharedPool, SharedWrite, Stmt, WgmmaOperand,
};
use crate::launch::Target;
use crate::task::DType;
use std::fmt::Write;

/// Conversions between f32 and a half type's raw bits, by inline PTX (kernels are
/// compiled without headers). `ts_to_f32` widens an element, `ts_from_f32` rounds to
/// nearest even.
fn conversions(dtype: DType) -> &'static str {
    match dtype {
        DType::Fp16 => {
            "__device__ __forceinline__ float ts_to_f32(unsigned short h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n\
__device__ __forceinline__ unsigned short ts_from_f32(float f) { unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
        }
        DType::Bf16 => {
            "__device__ __forceinline__ float ts_to_f32(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }\n\
__device__ __forceinline__ unsigned short ts_from_f32(float f) { unsigned short h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
        }
        DType::F32 | DType::Tf32 => "",
    }
}

/// Vector loads of 2 and 4 half elements (4 and 8 bytes, aligned like a `float2`/`float4`
/// of f32 data is in elements), widened to f32 vectors.
const HALF_VECTOR_LOADS: &str = "__device__ __forceinline__ float2 ts_load2(const unsigned short* p) { const unsigned v = *reinterpret_cast<const unsigned*>(p); return make_float2(ts_to_f32((unsigned short)(v & 0xffff)), ts_to_f32((unsigned short)(v >> 16))); }\n\
__device__ __forceinline__ float4 ts_load4(const unsigned short* p) { const uint2 v = *reinterpret_cast<const uint2*>(p); return make_float4(ts_to_f32((unsigned short)(v.x & 0xffff)), ts_to_f32((unsigned short)(v.x >> 16)), ts_to_f32((unsigned short)(v.y & 0xffff)), ts_to_f32((unsigned short)(v.y >> 16))); }\n";

/// The most fragments of each input a kernel's `LoadFragment`s use.
fn fragment_counts(body: &[Stmt], counts: &mut [usize; 2]) {
    Stmt::walk(body, &mut |s| {
        if let Stmt::LoadFragment {
            input, frag, count, ..
        } = s
        {
            counts[*input] = counts[*input].max(frag + count);
        }
    });
}

/// `extern "C" __global__ void __launch_bounds__(block) name(params) {` (after the
/// tensor map type when a parameter is one), then the mbarriers the body uses.
fn signature(out: &mut String, kernel: &Kernel) {
    if kernel
        .params
        .iter()
        .any(|p| matches!(p, Param::TensorMap { .. }))
    {
        let _ = writeln!(out, "{}", tma::MAP_TYPE_C);
    }
    let params: Vec<String> = kernel
        .params
        .iter()
        .map(|p| match p {
            Param::Buffer {
                name,
                role: Role::Output,
                dtype,
            } => format!("{}* __restrict__ {name}", dtype.c_type()),
            Param::Buffer { name, dtype, .. } => {
                format!("const {}* __restrict__ {name}", dtype.c_type())
            }
            Param::Workspace { name } => format!("unsigned* __restrict__ {name}"),
            Param::TensorMap { name, .. } => format!("const __grid_constant__ TmaMap {name}"),
        })
        .collect();
    let _ = writeln!(
        out,
        "extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{",
        kernel.launch.block,
        kernel.name,
        params.join(", ")
    );
    let barriers = kernel.barriers();
    if barriers > 0 {
        let _ = writeln!(
            out,
            "  __shared__ __align__(8) unsigned long long tilesched_barriers[{barriers}];"
        );
        let _ = writeln!(
            out,
            "  const unsigned barrier_base = (unsigned)__cvta_generic_to_shared(tilesched_barriers);"
        );
    }
}

/// The tensor-core kernel's opening: typed parameters, the byte pool and its shared
/// address, the lane, accumulators and fragment registers.
fn mma_opening(out: &mut String, kernel: &Kernel) {
    let _ = write!(out, "{}", conversions(kernel.dtype));
    if kernel.out_dtype != kernel.dtype {
        let _ = write!(out, "{}", conversions(kernel.out_dtype));
    }
    signature(out, kernel);
    let _ = writeln!(
        out,
        "  extern __shared__ __align__({}) unsigned char shared_pool[];",
        if has_tma(kernel) { 1024 } else { 16 }
    );
    let _ = writeln!(out, "  unsigned shared_base;");
    let _ = writeln!(
        out,
        "  asm(\"{{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }}\" : \"=r\"(shared_base) : \"l\"(shared_pool));"
    );
    let _ = writeln!(out, "  const int lane = (int)threadIdx.x & 31;");
    if let Some(staging) = kernel.staging {
        let _ = writeln!(
            out,
            "  {}* const staged = reinterpret_cast<{}*>(shared_pool + {});",
            kernel.out_dtype.c_type(),
            kernel.out_dtype.c_type(),
            staging.offset
        );
    }
    if kernel.semaphores > 0 {
        let _ = writeln!(
            out,
            "  float* partial = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(workspace) + {});",
            crate::ir::partials_offset(kernel.semaphores)
        );
    }
    let _ = writeln!(out, "  float acc[{}];", kernel.accumulators);
    let mut counts = [0, 0];
    fragment_counts(&kernel.body, &mut counts);
    let _ = writeln!(out, "  unsigned frag_a[{}][4];", counts[0].max(1));
    let _ = writeln!(out, "  unsigned frag_b[{}][2];", counts[1].max(1));
}

/// The leading comments: `header`, the launch configuration and, for split-K, that
/// the output must be zeroed.
fn leading_comments(out: &mut String, kernel: &Kernel, header: &[String]) {
    for line in header {
        let _ = writeln!(out, "// {line}");
    }
    let l = &kernel.launch;
    let [gx, gy, gz] = l.grid.as_array();
    let _ = write!(
        out,
        "// launch: grid ({gx}, {gy}, {gz}), block ({}, 1, 1)",
        l.block
    );
    if !l.cluster.is_one() {
        let [cx, cy, cz] = l.cluster.as_array();
        let _ = write!(out, ", cluster ({cx}, {cy}, {cz})");
    }
    let _ = writeln!(
        out,
        ", dynamic shared memory {} bytes",
        l.dynamic_shared_bytes
    );
    if l.target == Target::ArchSpecific {
        let _ = writeln!(
            out,
            "// target: the architecture-specific instruction set (sm_90a on Hopper)"
        );
    }
    if l.workspace_bytes > 0 {
        let _ = writeln!(
            out,
            "// workspace: {} bytes after the buffers, zeroed before the first launch (split-K's semaphores and partial sums; every launch leaves it zeroed)",
            l.workspace_bytes
        );
    }
    if l.zero_output {
        let _ = writeln!(
            out,
            "// split-K: {} blocks add into each output element; zero `out` before every launch",
            kernel.split_k
        );
    }
}

/// Generates the CUDA C source of `kernel`; `header` lines become leading comments.
pub fn cuda_source(kernel: &Kernel, header: &[String]) -> String {
    let mut out = String::new();
    leading_comments(&mut out, kernel, header);
    if kernel.shared == SharedPool::Typed {
        mma_opening(&mut out, kernel);
        Printer { kernel }.body(&mut out, &kernel.body, 1);
        out.push_str("}\n");
        return out;
    }
    // Half data: the tiles in shared memory and the arithmetic stay f32; elements are
    // widened as they are fetched and the result narrowed as it is stored.
    let _ = write!(out, "{}", conversions(kernel.dtype));
    if kernel.out_dtype != kernel.dtype {
        let _ = write!(out, "{}", conversions(kernel.out_dtype));
    }
    if kernel.dtype.bytes() == 2 {
        out.push_str(HALF_VECTOR_LOADS);
    }
    signature(&mut out, kernel);
    if has_tma(kernel) {
        let _ = writeln!(
            out,
            "  extern __shared__ __align__(1024) float4 shared_pool[];"
        );
    } else {
        let _ = writeln!(out, "  extern __shared__ float4 shared_pool[];");
    }
    for i in 0..2 {
        let _ = writeln!(
            out,
            "  float* {}_sh = reinterpret_cast<float*>(shared_pool) + {};",
            kernel.input(i),
            kernel.tile_offsets[i]
        );
    }
    let _ = writeln!(out, "  float acc[{}];", kernel.accumulators);
    Printer { kernel }.body(&mut out, &kernel.body, 1);
    out.push_str("}\n");
    out
}

/// Whether the kernel copies with TMA, whose destinations (and swizzle atoms) need the
/// pool aligned to 1024 bytes.
fn has_tma(kernel: &Kernel) -> bool {
    let mut tma = false;
    Stmt::walk(&kernel.body, &mut |s| {
        tma |= matches!(s, Stmt::TmaLoad { .. })
    });
    tma
}

/// The 32-bit shared address of mbarrier `barrier` (a C expression).
fn barrier_address(barrier: &str) -> String {
    format!("barrier_base + 8 * ({barrier})")
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
            Expr::BlockIdx if self.kernel.launch.grid.is_linear() => {
                ("(int)blockIdx.x".to_string(), u8::MAX)
            }
            // The IR's block index is the linear one, x fastest.
            Expr::BlockIdx => (
                "(int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))".to_string(),
                u8::MAX,
            ),
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
            Expr::Xor(a, b) => (format!("({} ^ {})", self.expr(a), self.expr(b)), u8::MAX),
            Expr::Min(a, b) => (format!("min({}, {})", self.expr(a), self.expr(b)), u8::MAX),
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
    fn global_value(&self, read: &GlobalRead) -> String {
        let (global, valid) = (&read.at, &read.valid);
        let name = self.kernel.input(read.input);
        let w = read.width;
        let half = self.kernel.dtype.bytes() == 2;
        let (load, zero) = if w == 1 && half {
            (
                format!("ts_to_f32({name}[{}])", self.expr(global)),
                "0.0f".to_string(),
            )
        } else if w == 1 {
            (format!("{name}[{}]", self.expr(global)), "0.0f".to_string())
        } else if half {
            (
                format!("ts_load{w}({name} + {})", self.expr_in(global, ADD)),
                format!("make_float{w}({})", vec!["0.0f"; w as usize].join(", ")),
            )
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
    fn shared_store(&self, out: &mut String, pad: &str, to: &SharedWrite, value: &str) {
        let name = self.kernel.input(to.input);
        let w = to.width;
        if to.scattered() {
            for (j, component) in ["x", "y", "z", "w"].iter().take(w as usize).enumerate() {
                let at = self
                    .scope()
                    .add(to.at.clone(), Expr::Const(j as i64 * to.step));
                let _ = writeln!(
                    out,
                    "{pad}{name}_sh[{}] = {value}.{component};",
                    self.expr(&at)
                );
            }
        } else if w == 1 {
            let _ = writeln!(out, "{pad}{name}_sh[{}] = {value};", self.expr(&to.at));
        } else {
            let _ = writeln!(
                out,
                "{pad}*reinterpret_cast<float{w}*>({name}_sh + {}) = {value};",
                self.expr_in(&to.at, ADD)
            );
        }
    }

    /// Byte address in shared memory of element `at` (a C expression) of input
    /// `input`'s tile.
    /// The 32-bit shared address of element `at` of input `input`'s tile, in either
    /// pool.
    fn tile_address(&self, input: usize, at: &str) -> String {
        match self.kernel.shared {
            SharedPool::Typed => self.shared_address(input, at),
            SharedPool::FloatTiles => format!(
                "(unsigned)__cvta_generic_to_shared({}_sh + ({at}))",
                self.kernel.input(input)
            ),
        }
    }

    fn shared_address(&self, input: usize, at: &str) -> String {
        let bytes = self.kernel.dtype.bytes();
        let off = self.kernel.tile_offsets[input];
        format!("shared_base + (unsigned)(({off} + {at}) * {bytes})")
    }

    fn async_copy(&self, out: &mut String, pad: &str, read: &GlobalRead, write: &SharedWrite) {
        let (input, global, valid) = (read.input, &read.at, &read.valid);
        let name = self.kernel.input(input);
        let bytes = read.width * self.kernel.dtype.bytes();
        let at = self.expr(&write.at);
        if FillCopy::of(bytes, self.kernel.dtype.bytes()) == Some(FillCopy::Element) {
            // One half: an ordinary load and store.
            let value = if valid.is_empty() {
                format!("{name}[{}]", self.expr(global))
            } else {
                format!(
                    "({}) ? {name}[{}] : (unsigned short)0",
                    self.conds(valid),
                    self.expr(global)
                )
            };
            let off = self.kernel.tile_offsets[input];
            let _ = writeln!(
                out,
                "{pad}reinterpret_cast<unsigned short*>(shared_pool)[{off} + {at}] = {value};"
            );
            return;
        }
        let cache = FillCopy::cache(bytes);
        let address = self.shared_address(input, &at);
        if valid.is_empty() {
            let _ = writeln!(
                out,
                "{pad}asm volatile(\"cp.async.{cache}.shared.global [%0], [%1], {bytes};\\n\" :: \"r\"({address}), \"l\"({name} + {}));",
                self.expr_in(global, ADD)
            );
        } else {
            // Zero-fill: a source size of 0 reads nothing (from the tensor's base).
            let _ = writeln!(out, "{pad}{{");
            let _ = writeln!(out, "{pad}  const bool ok = {};", self.conds(valid));
            let _ = writeln!(
                out,
                "{pad}  asm volatile(\"cp.async.{cache}.shared.global [%0], [%1], {bytes}, %2;\\n\" :: \"r\"({address}), \"l\"({name} + (ok ? {} : 0)), \"r\"(ok ? {bytes} : 0));",
                self.expr(global)
            );
            let _ = writeln!(out, "{pad}}}");
        }
    }

    /// One MMA operand fragment from shared memory: `ldmatrix` with the lane
    /// addresses its matrices need (`.trans` for an N-major B), or, for a TF32
    /// N-major B (which `ldmatrix` cannot transpose: it moves 16-bit elements), two
    /// 32-bit loads per lane at the fragment's positions.
    #[allow(clippy::too_many_arguments)]
    fn load_fragment(
        &self,
        out: &mut String,
        pad: &str,
        input: usize,
        (frag, count): (usize, usize),
        base: &Expr,
        row: &Expr,
        k: &Expr,
        layout: &SharedTileLayout,
        k_major: bool,
    ) {
        let (base, row, k) = (
            self.expr_in(base, ADD),
            self.expr_in(row, ADD),
            self.expr_in(k, ADD),
        );
        let e = layout.chunk_elements;
        let atom = MmaAtom::sizing(self.kernel.dtype);
        if input == 1 && !k_major && self.kernel.dtype.bytes() == 4 {
            // B's fragment itself, one 32-bit element per register: k and n of value
            // `reg`, the lane's part printed, the value's a constant.
            let b = atom.b;
            for f in 0..count {
                for reg in 0..atom.b_registers {
                    let dk = fragment::part(&Numbers, b.row, Index::Value, reg as i64).unwrap_or(0);
                    let at = layout.c(
                        &format!("{k} + {} + {dk}", lane_c(b.row, "lane")),
                        &format!(
                            "{row} + {} + {}",
                            atom.n * f as i64,
                            lane_c(b.column, "lane")
                        ),
                    );
                    let _ = writeln!(
                        out,
                        "{pad}frag_b[{}][{reg}] = reinterpret_cast<const unsigned*>(shared_pool)[{} + {base} + {at}];",
                        frag + f,
                        self.kernel.tile_offsets[input]
                    );
                }
            }
            return;
        }
        // B registers of `count` fragments, in the order ldmatrix's matrices fill them.
        let b_regs: Vec<String> = (0..count)
            .flat_map(|f| (0..atom.b_registers).map(move |i| format!("frag_b[{}][{i}]", frag + f)))
            .collect();
        let (form, regs) = if input == 0 {
            let regs = (0..atom.a_registers)
                .map(|i| format!("frag_a[{frag}][{i}]"))
                .collect::<Vec<_>>();
            (Ldmatrix::A, regs)
        } else {
            (Ldmatrix::b(k_major, count), b_regs)
        };
        // The lane's tile row and column from the fragment's origin: (row, k) as stored
        // for A and a K-major B, (k, row) for an N-major B.
        let offset = |origin: &str, terms: &[Term], scale: i64| {
            let scaled: Vec<Term> = terms.iter().map(|t| t.scaled(scale)).collect();
            if scaled.is_empty() {
                origin.to_string()
            } else {
                format!("{origin} + {}", lane_c(&scaled, "lane"))
            }
        };
        let (r, c) = if input == 0 || k_major {
            (offset(&row, form.rows, 1), offset(&k, form.chunks, e))
        } else {
            (offset(&k, form.rows, 1), offset(&row, form.chunks, e))
        };
        let shape = form.shape;
        let at = format!("{base} + {}", layout.c(&r, &c));
        let outs: Vec<String> = regs.iter().map(|r| format!("\"=r\"({r})")).collect();
        let slots: Vec<String> = (0..regs.len()).map(|i| format!("%{i}")).collect();
        let _ = writeln!(
            out,
            "{pad}asm volatile(\"ldmatrix.sync.aligned.m8n8.{shape}.shared.b16 {{{}}}, [%{}];\\n\" : {} : \"r\"({}));",
            slots.join(","),
            regs.len(),
            outs.join(", "),
            self.shared_address(input, &at)
        );
    }

    /// A row-span A fragment: each register's pair of k (values `2i` and `2i + 1` of
    /// the atom's A layout) is one 32-bit shared load, at an even element.
    fn gather_fragment(
        &self,
        out: &mut String,
        pad: &str,
        frag: usize,
        (base, row, k): (&Expr, &Expr, &Expr),
        layout: &SpanLayout,
    ) {
        let (base, row, k) = (
            self.expr_in(base, ADD),
            self.expr_in(row, ADD),
            self.expr_in(k, ADD),
        );
        let atom = MmaAtom::sizing(self.kernel.dtype);
        let a = atom.a;
        for reg in 0..atom.a_registers {
            let value = 2 * reg as i64;
            let dr = fragment::part(&Numbers, a.row, Index::Value, value).unwrap_or(0);
            let dk = fragment::part(&Numbers, a.column, Index::Value, value).unwrap_or(0);
            let at = layout.c(
                &format!("{row} + {} + {dr}", lane_c(a.row, "lane")),
                &format!("{k} + {} + {dk}", lane_c(a.column, "lane")),
            );
            let _ = writeln!(
                out,
                "{pad}frag_a[{frag}][{reg}] = reinterpret_cast<const unsigned*>(shared_pool)[({} + {base} + {at}) >> 1];",
                self.kernel.tile_offsets[0]
            );
        }
    }

    /// Keeps the compiler from moving accumulator accesses across the asynchronous
    /// MMAs' fence and wait: an empty asm that "writes" every accumulator.
    fn fence_accumulators(&self, out: &mut String, pad: &str) {
        let n = self.kernel.accumulators;
        let _ = writeln!(out, "{pad}#pragma unroll");
        let _ = writeln!(
            out,
            "{pad}for (int i = 0; i < {n}; ++i) asm volatile(\"\" : \"+f\"(acc[i]) :: \"memory\");"
        );
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
            Stmt::WarpUniform { var, value } => {
                let name = &self.scope().vars[var.0].name;
                let _ = writeln!(
                    out,
                    "{pad}const int {name} = __shfl_sync(0xffffffffu, {}, 0);",
                    self.expr(value)
                );
            }
            Stmt::Concurrent { parts } => self.body(out, parts, depth),
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
            Stmt::Fetch { read, write: to } => {
                let value = self.global_value(read);
                let width = read.width;
                if to.scattered() {
                    // The vector is loaded once, then stored component by component.
                    let name = self.kernel.input(read.input);
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
            Stmt::RegisterLoad { array, slot, read } => {
                let value = self.global_value(read);
                let _ = writeln!(out, "{pad}pf{array}[{}] = {value};", self.expr(slot));
            }
            Stmt::RegisterStore { array, slot, write } => {
                let value = format!("pf{array}[{}]", self.expr(slot));
                self.shared_store(out, &pad, write, &value);
            }
            Stmt::Block { body } => {
                let _ = writeln!(out, "{pad}{{");
                self.body(out, body, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::AsyncCopy { read, write } => self.async_copy(out, &pad, read, write),
            Stmt::CommitGroup => {
                let _ = writeln!(out, "{pad}asm volatile(\"cp.async.commit_group;\\n\" ::);");
            }
            Stmt::WaitGroup { pending } => {
                let _ = writeln!(
                    out,
                    "{pad}asm volatile(\"cp.async.wait_group {pending};\\n\" ::: \"memory\");"
                );
            }
            Stmt::LoadFragment {
                input,
                frag,
                count,
                base,
                row,
                k,
                layout,
                k_step: _,
                k_major,
            } => match layout {
                OperandLayout::Tile(layout) => self.load_fragment(
                    out,
                    &pad,
                    *input,
                    (*frag, *count),
                    base,
                    row,
                    k,
                    layout,
                    *k_major,
                ),
                OperandLayout::Span(layout) => {
                    self.gather_fragment(out, &pad, *frag, (base, row, k), layout)
                }
            },
            Stmt::MbarrierInit { barrier, arrivals } => {
                let bar = barrier_address(&self.expr(barrier));
                let _ = writeln!(out, "{pad}{}", tma::mbarrier_init_c(&bar, *arrivals));
            }
            Stmt::ArriveExpectTx { barrier, bytes } => {
                let bar = barrier_address(&self.expr(barrier));
                let _ = writeln!(out, "{pad}{}", tma::arrive_expect_tx_c(&bar, *bytes));
            }
            Stmt::TmaLoad {
                map,
                coords,
                at,
                barrier,
                multicast,
            } => {
                let (name, input, tensor) = self.kernel.tensor_map(*map);
                let coords: Vec<String> = coords.iter().map(|c| self.expr(c)).collect();
                // An im2col map's filter offsets follow its coordinates.
                let (coords, offsets) = coords.split_at(tensor.dims.len());
                let dst = self.tile_address(input, &self.expr(at));
                let bar = barrier_address(&self.expr(barrier));
                let mask = multicast
                    .as_ref()
                    .map(|r| format!("({}u << ({}))", r.pattern, self.expr(&r.first)));
                let load = tma::load_c(name, (coords, offsets), &dst, &bar, mask.as_deref());
                let _ = writeln!(out, "{pad}{load}");
            }
            Stmt::ClusterArrive { barrier, ranks } => {
                let bar = barrier_address(&self.expr(barrier));
                let first = self.expr(&ranks.first);
                for bit in ranks.of(0) {
                    let arrive = tma::cluster_arrive_c(&bar, &format!("({first}) + {bit}"));
                    let _ = writeln!(out, "{pad}{arrive}");
                }
            }
            Stmt::ClusterSync => {
                let _ = writeln!(out, "{pad}{}", tma::CLUSTER_SYNC_C);
            }
            Stmt::FenceProxyAsync => {
                let _ = writeln!(out, "{pad}{}", tma::FENCE_PROXY_ASYNC_C);
            }
            Stmt::NamedSync { id, threads } => {
                let _ = writeln!(
                    out,
                    "{pad}asm volatile(\"bar.sync %0, {threads};\" :: \"r\"({}) : \"memory\");",
                    self.expr(id)
                );
            }
            Stmt::TmaStore { map, coords, from } => {
                let (name, _, _) = self.kernel.tensor_map(*map);
                let coords: Vec<String> = coords.iter().map(|c| self.expr(c)).collect();
                let staging = self
                    .kernel
                    .staging
                    .expect("a TMA store has staging buffers");
                let bytes = self.kernel.out_dtype.bytes();
                let src = format!(
                    "shared_base + (unsigned)({} + ({}) * {bytes})",
                    staging.offset,
                    self.expr(from)
                );
                let _ = writeln!(out, "{pad}{}", tma::store_c(name, &coords, &src));
            }
            Stmt::BulkWait { pending } => {
                let _ = writeln!(out, "{pad}{}", tma::store_wait_read_c(*pending));
            }
            Stmt::MbarrierWait { barrier, parity } => {
                let bar = barrier_address(&self.expr(barrier));
                let _ = writeln!(out, "{pad}{}", tma::wait_parity_c(&bar, &self.expr(parity)));
            }
            Stmt::MbarrierArrive { barrier } => {
                let bar = barrier_address(&self.expr(barrier));
                let _ = writeln!(out, "{pad}{}", tma::arrive_c(&bar));
            }
            Stmt::PartialStore {
                acc,
                at,
                valid,
                atomic,
            } => {
                let (at, acc) = (self.expr(at), self.expr(acc));
                // The result unused, the atomic compiles to a reduction.
                let store = if *atomic {
                    format!("atomicAdd(&partial[{at}], acc[{acc}]);")
                } else {
                    format!("partial[{at}] = acc[{acc}];")
                };
                let _ = writeln!(out, "{pad}{}", self.when(valid, &store));
            }
            Stmt::PartialAdd {
                acc,
                at,
                valid,
                clear,
            } => {
                let (at, acc) = (self.expr(at), self.expr(acc));
                let add = if *clear {
                    format!(
                        "{{ acc[{acc}] += __ldcg(&partial[{at}]); __stcg(&partial[{at}], 0.0f); }}"
                    )
                } else {
                    format!("acc[{acc}] += __ldcg(&partial[{at}]);")
                };
                let _ = writeln!(out, "{pad}{}", self.when(valid, &add));
            }
            Stmt::LastArrival {
                counter,
                arrivals,
                weight,
                body,
            } => {
                // Each thread's partial stores are made visible device-wide, the warp
                // converges, and its first lane arrives for all; the last arrival sees
                // every published store once its own fence orders the reads after it.
                let c = self.expr(counter);
                let _ = writeln!(out, "{pad}{{");
                let _ = writeln!(out, "{pad}  __threadfence();");
                let _ = writeln!(out, "{pad}  __syncwarp();");
                let _ = writeln!(out, "{pad}  unsigned arrived = 0u;");
                let unit = *weight == Expr::Const(1);
                let weight = match weight {
                    Expr::Const(w) => format!("{w}u"),
                    w => format!("(unsigned)({})", self.expr(w)),
                };
                let _ = writeln!(
                    out,
                    "{pad}  if (lane == 0) arrived = atomicAdd(&workspace[{c}], {weight});"
                );
                let _ = writeln!(
                    out,
                    "{pad}  arrived = __shfl_sync(0xffffffffu, arrived, 0);"
                );
                if unit {
                    let _ = writeln!(out, "{pad}  if (arrived == {}u) {{", arrivals - 1);
                } else {
                    let _ = writeln!(out, "{pad}  if (arrived + {weight} == {arrivals}u) {{");
                }
                let _ = writeln!(out, "{pad}    if (lane == 0) workspace[{c}] = 0u;");
                let _ = writeln!(out, "{pad}    __threadfence();");
                self.body(out, body, depth + 2);
                let _ = writeln!(out, "{pad}  }}");
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::WgmmaFence => {
                self.fence_accumulators(out, &pad);
                let _ = writeln!(out, "{pad}{}", wgmma::FENCE_C);
            }
            Stmt::WgmmaCommit => {
                let _ = writeln!(out, "{pad}{}", wgmma::COMMIT_C);
            }
            Stmt::WgmmaWait { pending } => {
                let _ = writeln!(out, "{pad}{}", wgmma::wait_c(*pending));
                self.fence_accumulators(out, &pad);
            }
            Stmt::Wgmma { acc, n, a, b } => {
                let atom = WgmmaAtom::for_dtype(self.kernel.dtype)
                    .expect("wgmma kernels have tensor-core inputs");
                let bytes = i64::from(self.kernel.dtype.bytes());
                let descriptor = |operand: &WgmmaOperand| {
                    let off = self.kernel.tile_offsets[operand.input] * bytes;
                    let at = format!(
                        "shared_base + (unsigned)({off} + {})",
                        self.expr(&operand.start)
                    );
                    operand.layout.descriptor_c(&at)
                };
                let _ = writeln!(
                    out,
                    "{pad}{}",
                    atom.issue_c(
                        *n,
                        ("acc", *acc),
                        (&descriptor(a), &descriptor(b)),
                        b.layout.major
                    )
                );
            }
            Stmt::Mma { acc, a, b } => {
                let shape = MmaAtom::sizing(self.kernel.dtype).ptx;
                let _ = writeln!(
                    out,
                    "{pad}asm volatile(\"mma.sync.aligned.{shape} {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\\n\" : \"+f\"(acc[{}]), \"+f\"(acc[{}]), \"+f\"(acc[{}]), \"+f\"(acc[{}]) : \"r\"(frag_a[{a}][0]), \"r\"(frag_a[{a}][1]), \"r\"(frag_a[{a}][2]), \"r\"(frag_a[{a}][3]), \"r\"(frag_b[{b}][0]), \"r\"(frag_b[{b}][1]));",
                    acc,
                    acc + 1,
                    acc + 2,
                    acc + 3
                );
            }
            Stmt::Fma { acc, a, b } => {
                let (na, nb) = (self.kernel.input(0), self.kernel.input(1));
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
                width,
                staged,
            } => {
                let half_in = self.kernel.dtype.bytes() == 2;
                let half_out = self.kernel.out_dtype.bytes() == 2;
                // The value of accumulator `acc + j` through the epilogue.
                let value = |j: i64| {
                    let plus = |e: &Expr| self.expr(&self.scope().add(e.clone(), Expr::Const(j)));
                    let mut value = format!("acc[{}]", plus(acc));
                    if let Some(b) = bias {
                        let load = if half_in {
                            format!("ts_to_f32(bias[{}])", plus(b))
                        } else {
                            format!("bias[{}]", plus(b))
                        };
                        if bias_when.is_empty() {
                            value = format!("{value} + {load}");
                        } else {
                            let when = self.chunk_conds(bias_when);
                            value = format!("{value} + ({when} ? {load} : 0.0f)");
                        }
                    }
                    if self.kernel.relu {
                        value = format!("fmaxf({value}, 0.0f)");
                    }
                    value
                };
                let at = self.expr(index);
                // The output, or the staging buffers in the pool.
                let to = if *staged { "staged" } else { "out" };
                let store = match (*width, *atomic, half_out) {
                    (1, true, _) => format!("atomicAdd(&out[{at}], {});", value(0)),
                    (1, false, true) => format!("{to}[{at}] = ts_from_f32({});", value(0)),
                    (1, false, false) => format!("{to}[{at}] = {};", value(0)),
                    // A pair: one 32-bit store of two halves, or one float2.
                    (_, false, true) => format!(
                        "*reinterpret_cast<unsigned*>(&{to}[{at}]) = (unsigned)ts_from_f32({}) | ((unsigned)ts_from_f32({}) << 16);",
                        value(0),
                        value(1)
                    ),
                    (_, false, false) => format!(
                        "*reinterpret_cast<float2*>(&{to}[{at}]) = make_float2({}, {});",
                        value(0),
                        value(1)
                    ),
                    (_, true, _) => format!(
                        "{{ atomicAdd(&out[{at}], {}); atomicAdd(&out[{at} + 1], {}); }}",
                        value(0),
                        value(1)
                    ),
                };
                let _ = writeln!(out, "{pad}{}", self.when(valid, &store));
            }
        }
    }

    /// `statement` under `valid` (unconditional when it is empty).
    fn when(&self, valid: &[Cond], statement: &str) -> String {
        if valid.is_empty() {
            statement.to_string()
        } else {
            format!("if ({}) {statement}", self.conds(valid))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::{Dim3, Target};
    use crate::{Epilogue, GpuSpec, Sampler, Task, interp, lower::lower, parse_shape};

    /// The IR's block index is the linear one: on a 3-D grid, the printed kernel
    /// computes it from all three coordinates, and the interpreter, which runs the
    /// blocks by that index, gives the same output as on the 1-D grid.
    #[test]
    fn a_three_dimensional_grid_prints_the_linear_block_index() {
        let task = Task::new(
            parse_shape("matmul", "40,48,24").unwrap(),
            Epilogue::default(),
        )
        .unwrap();
        let state = Sampler::new(&task, &GpuSpec::h100(), 3)
            .sample_distinct(16)
            .into_iter()
            .find(|s| s.blocks(&task.contraction()) % 2 == 0)
            .expect("a state of an even block count");
        let linear = lower(&task, &state);
        let half = linear.launch.grid.x / 2;
        let mut reshaped = linear.clone();
        reshaped.launch.grid = Dim3 {
            x: 1,
            y: half,
            z: 2,
        };
        reshaped.launch.cluster = Dim3 {
            x: 1,
            y: half,
            z: 1,
        };
        reshaped.launch.target = Target::ArchSpecific;
        let a: Vec<f32> = (0..40 * 24).map(|i| (i % 5) as f32 - 2.0).collect();
        let b: Vec<f32> = (0..24 * 48).map(|i| (i % 3) as f32 - 1.0).collect();
        let inputs = interp::Inputs {
            inputs: [&a, &b],
            bias: None,
        };
        assert_eq!(
            interp::run(&reshaped, &inputs, 40 * 48).unwrap(),
            interp::run(&linear, &inputs, 40 * 48).unwrap()
        );
        let source = cuda_source(&reshaped, &[]);
        assert!(source.contains("blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)"));
        assert!(!cuda_source(&linear, &[]).contains("gridDim"));
        let grid = format!("// launch: grid (1, {half}, 2), block (");
        assert!(source.contains(&grid), "{source}");
        assert!(source.contains(&format!(", cluster (1, {half}, 1), dynamic shared memory")));
        assert!(source.contains("// target: the architecture-specific instruction set"));
    }
}
