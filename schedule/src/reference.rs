//! The reference kernel: the task's definition written as plainly as CUDA allows (one
//! thread per output element, a loop over every reduction axis, each index computed from
//! the contraction's affine form and bounds-checked). The measurement worker runs it to
//! obtain the expected output that every candidate is compared with, so it shares
//! nothing with the tiled lowering it checks.
//!
//! Element types: inputs and bias are read in the task's type (fp16 and bf16 as raw
//! `unsigned short` bits widened to f32 with inline PTX, since NVRTC compiles without
//! `cuda_fp16.h`; TF32 data is plain f32 and multiplied in full f32, which is what a TF32
//! tensor core computes on the small integers the check uses), products accumulate in
//! f32, the epilogue runs in f32, and the last step rounds to the output type to nearest
//! even. An f32 task's source is exactly what it was before types existed.

use crate::task::{Access, AffineIndex, AxisRef, Contraction, DType, Task};
use crate::{GeneratedKernel, LaunchConfig};
use std::fmt::Write;

/// Threads per block of the reference kernel.
const BLOCK: u32 = 256;

/// The C expression of one affine index over the axis variables `s<i>` and `r<i>`.
fn index_expr(index: &AffineIndex) -> String {
    let mut terms: Vec<String> = index
        .terms
        .iter()
        .map(|&(axis, coeff)| {
            let var = match axis {
                AxisRef::Spatial(i) => format!("s{i}"),
                AxisRef::Reduction(i) => format!("r{i}"),
            };
            if coeff == 1 {
                var
            } else {
                format!("{coeff} * {var}")
            }
        })
        .collect();
    if index.offset != 0 || terms.is_empty() {
        terms.push(format!("({})", index.offset));
    }
    terms.join(" + ")
}

/// Declares `<name>_d<i>` for each dimension of `access`, then `<name>_ok` (all in
/// bounds) and `<name>_at` (the flat offset, meaningful when in bounds).
fn access_lines(access: &Access, name: &str, indent: &str, out: &mut String) {
    let strides = access.strides();
    let mut ok = Vec::new();
    let mut at = Vec::new();
    for (d, (index, &dim)) in access.index.iter().zip(&access.shape).enumerate() {
        let _ = writeln!(
            out,
            "{indent}const long long {name}_d{d} = {};",
            index_expr(index)
        );
        ok.push(format!("{name}_d{d} >= 0 && {name}_d{d} < {dim}"));
        at.push(format!("{name}_d{d} * {}", strides[d]));
    }
    if ok.is_empty() {
        ok.push("true".to_string());
        at.push("0".to_string());
    }
    let _ = writeln!(out, "{indent}const bool {name}_ok = {};", ok.join(" && "));
    let _ = writeln!(
        out,
        "{indent}const long long {name}_at = {};",
        at.join(" + ")
    );
}

/// Device helpers converting half bits to and from f32, only those `c` uses (none for
/// f32 data, so that an f32 kernel's source stays as it was).
fn conversion_helpers(c: &Contraction) -> String {
    let mut out = String::new();
    match c.dtype {
        DType::Fp16 => out.push_str(
            "static __device__ __forceinline__ float tilesched_load_fp16(unsigned short h) {\n  float f;\n  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n  return f;\n}\n",
        ),
        // bf16 is the top half of an f32: widening is a shift.
        DType::Bf16 => out.push_str(
            "static __device__ __forceinline__ float tilesched_load_bf16(unsigned short h) {\n  return __uint_as_float((unsigned)h << 16);\n}\n",
        ),
        DType::F32 | DType::Tf32 => {}
    }
    match c.out_dtype {
        DType::Fp16 | DType::Bf16 => {
            let name = c.out_dtype.name();
            // PTX spells the types f16 and bf16.
            let ptx = if c.out_dtype == DType::Fp16 {
                "f16"
            } else {
                "bf16"
            };
            let _ = writeln!(
                out,
                "static __device__ __forceinline__ unsigned short tilesched_store_{name}(float f) {{\n  unsigned short h;\n  asm(\"cvt.rn.{ptx}.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n  return h;\n}}"
            );
        }
        DType::F32 | DType::Tf32 => {}
    }
    out
}

/// The f32 value of element `at` of `tensor`, read in type `dtype`.
fn load(dtype: DType, tensor: &str, at: &str) -> String {
    match dtype {
        DType::F32 | DType::Tf32 => format!("{tensor}[{at}]"),
        DType::Fp16 | DType::Bf16 => format!("tilesched_load_{}({tensor}[{at}])", dtype.name()),
    }
}

/// The reference kernel of `task`. Its parameters are those of every generated
/// candidate: the two inputs, the bias when the epilogue has one, then the output.
pub fn reference_kernel(task: &Task) -> GeneratedKernel {
    let c: Contraction = task.contraction();
    let name = format!("reference_{}", task.key());
    let outputs = c.output_elements();
    let [a, b] = &c.inputs;
    let in_type = c.dtype.c_type();
    let mut params = vec![
        format!("const {in_type}* __restrict__ {}", a.tensor),
        format!("const {in_type}* __restrict__ {}", b.tensor),
    ];
    if let Some(bias) = &c.bias {
        params.push(format!("const {in_type}* __restrict__ {}", bias.tensor));
    }
    params.push(format!("{}* __restrict__ out", c.out_dtype.c_type()));

    let mut src = String::new();
    let _ = writeln!(src, "// tilesched reference kernel for {}", task.key());
    src.push_str(&conversion_helpers(&c));
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void {name}({}) {{",
        params.join(", ")
    );
    let _ = writeln!(
        src,
        "  const long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
    );
    let _ = writeln!(src, "  if (o >= {outputs}LL) return;");
    // Unflatten the output index over the spatial axes (row-major).
    let mut rest = "o".to_string();
    for (i, axis) in c.spatial.iter().enumerate().rev() {
        let _ = writeln!(
            src,
            "  const long long s{i} = {rest} % {}; // {}",
            axis.extent, axis.name
        );
        let _ = writeln!(src, "  const long long q{i} = {rest} / {};", axis.extent);
        rest = format!("q{i}");
    }
    let _ = writeln!(src, "  float sum = 0.0f;");
    let mut indent = "  ".to_string();
    for (i, axis) in c.reduction.iter().enumerate() {
        let _ = writeln!(
            src,
            "{indent}for (long long r{i} = 0; r{i} < {}; ++r{i}) {{ // {}",
            axis.extent, axis.name
        );
        indent.push_str("  ");
    }
    access_lines(a, "x", &indent, &mut src);
    access_lines(b, "y", &indent, &mut src);
    let _ = writeln!(
        src,
        "{indent}if (x_ok && y_ok) sum += {} * {};",
        load(c.dtype, a.tensor, "x_at"),
        load(c.dtype, b.tensor, "y_at")
    );
    for _ in &c.reduction {
        indent.truncate(indent.len() - 2);
        let _ = writeln!(src, "{indent}}}");
    }
    if let Some(bias) = &c.bias {
        access_lines(bias, "z", "  ", &mut src);
        let _ = writeln!(src, "  sum += {};", load(c.dtype, bias.tensor, "z_at"));
    }
    if c.relu {
        let _ = writeln!(src, "  sum = fmaxf(sum, 0.0f);");
    }
    match c.out_dtype {
        DType::F32 | DType::Tf32 => {
            let _ = writeln!(src, "  out[o] = sum;");
        }
        // Rounded to nearest even, once, after the epilogue.
        DType::Fp16 | DType::Bf16 => {
            let _ = writeln!(
                src,
                "  out[o] = tilesched_store_{}(sum);",
                c.out_dtype.name()
            );
        }
    }
    let _ = writeln!(src, "}}");
    GeneratedKernel {
        name,
        source: src,
        launch: LaunchConfig::linear(outputs.div_ceil(u64::from(BLOCK)) as u32, BLOCK, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Epilogue, Layout, parse_shape};

    fn task(op: &str, shape: &str, bias: bool, relu: bool) -> Task {
        Task::new(parse_shape(op, shape).unwrap(), Epilogue { bias, relu }).unwrap()
    }

    #[test]
    fn an_f32_source_is_what_it_was_before_types() {
        // Pinned from the generator before element types existed: f32 tasks must keep
        // their reference (and so their cubins in existing caches) byte for byte.
        let expected = r#"// tilesched reference kernel for matmul_m64_n64_k64_bias_relu
extern "C" __global__ void reference_matmul_m64_n64_k64_bias_relu(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias, float* __restrict__ out) {
  const long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= 4096LL) return;
  const long long s1 = o % 64; // n
  const long long q1 = o / 64;
  const long long s0 = q1 % 64; // m
  const long long q0 = q1 / 64;
  float sum = 0.0f;
  for (long long r0 = 0; r0 < 64; ++r0) { // k
    const long long x_d0 = s0;
    const long long x_d1 = r0;
    const bool x_ok = x_d0 >= 0 && x_d0 < 64 && x_d1 >= 0 && x_d1 < 64;
    const long long x_at = x_d0 * 64 + x_d1 * 1;
    const long long y_d0 = r0;
    const long long y_d1 = s1;
    const bool y_ok = y_d0 >= 0 && y_d0 < 64 && y_d1 >= 0 && y_d1 < 64;
    const long long y_at = y_d0 * 64 + y_d1 * 1;
    if (x_ok && y_ok) sum += A[x_at] * B[y_at];
  }
  const long long z_d0 = s1;
  const bool z_ok = z_d0 >= 0 && z_d0 < 64;
  const long long z_at = z_d0 * 1;
  sum += bias[z_at];
  sum = fmaxf(sum, 0.0f);
  out[o] = sum;
}
"#;
        let k = reference_kernel(&task("matmul", "64,64,64", true, true));
        assert_eq!(k.source, expected);
        assert_eq!(k.name, "reference_matmul_m64_n64_k64_bias_relu");
        assert_eq!((k.launch.grid, k.launch.block), (16.into(), 256));
    }

    #[test]
    fn half_inputs_are_read_as_bits_and_the_output_rounded_once() {
        let conv = task("conv2d", "1,8,6,6,4,3,3,1,1", true, true);
        let fp16 = conv
            .with_types(DType::Fp16, DType::Fp16, Layout::Nhwc)
            .unwrap();
        let src = reference_kernel(&fp16).source;
        assert!(!src.contains("#include"), "{src}");
        assert!(src.contains("const unsigned short* __restrict__ data, const unsigned short* __restrict__ weight, const unsigned short* __restrict__ bias, unsigned short* __restrict__ out)"), "{src}");
        assert!(src.contains(r#"asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));"#));
        assert!(src.contains(r#"asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));"#));
        assert!(src.contains(
            "sum += tilesched_load_fp16(data[x_at]) * tilesched_load_fp16(weight[y_at]);"
        ));
        assert!(src.contains("sum += tilesched_load_fp16(bias[z_at]);"));
        // The epilogue runs in f32; the conversion is the last step.
        assert!(
            src.contains("  sum = fmaxf(sum, 0.0f);\n  out[o] = tilesched_store_fp16(sum);\n}")
        );

        let bf16 = conv
            .with_types(DType::Bf16, DType::Bf16, Layout::Nhwc)
            .unwrap();
        let src = reference_kernel(&bf16).source;
        assert!(src.contains("return __uint_as_float((unsigned)h << 16);"));
        assert!(src.contains(r#"asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));"#));
        assert!(!src.contains("fp16"));

        // Half inputs with an f32 output: no store helper, a float output.
        let mixed = conv
            .with_types(DType::Bf16, DType::F32, Layout::Nhwc)
            .unwrap();
        let src = reference_kernel(&mixed).source;
        assert!(src.contains("float* __restrict__ out)") && !src.contains("store"));
        assert!(src.contains("  out[o] = sum;\n"));
    }

    #[test]
    fn tf32_reads_f32_and_multiplies_in_full_f32() {
        // Small integers are exact in TF32, so a tensor-core TF32 kernel must match the
        // full-f32 products exactly: the reference is the f32 one under another name.
        let conv = task("conv2d", "1,8,6,6,4,3,3,1,1", true, false);
        let f32_nhwc = conv
            .with_types(DType::F32, DType::F32, Layout::Nhwc)
            .unwrap();
        let tf32 = conv
            .with_types(DType::Tf32, DType::F32, Layout::Nhwc)
            .unwrap();
        let renamed = reference_kernel(&f32_nhwc)
            .source
            .replace(&f32_nhwc.key(), &tf32.key());
        assert_eq!(reference_kernel(&tf32).source, renamed);
    }
}
