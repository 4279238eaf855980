//! The reference kernel: the task's definition written as plainly as CUDA allows (one
//! thread per output element, a loop over every reduction axis, each index computed from
//! the contraction's affine form and bounds-checked). The measurement worker runs it to
//! obtain the expected output that every candidate is compared with, so it shares
//! nothing with the tiled lowering it checks.

use crate::task::{Access, AffineIndex, AxisRef, Contraction, Task};
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

/// The reference kernel of `task`. Its parameters are those of every generated
/// candidate: the two inputs, the bias when the epilogue has one, then the output.
pub fn reference_kernel(task: &Task) -> GeneratedKernel {
    let c: Contraction = task.contraction();
    let name = format!("reference_{}", task.key());
    let outputs = c.output_elements();
    let [a, b] = &c.inputs;
    let mut params = vec![
        format!("const float* __restrict__ {}", a.tensor),
        format!("const float* __restrict__ {}", b.tensor),
    ];
    if let Some(bias) = &c.bias {
        params.push(format!("const float* __restrict__ {}", bias.tensor));
    }
    params.push("float* __restrict__ out".to_string());

    let mut src = String::new();
    let _ = writeln!(src, "// tilesched reference kernel for {}", task.key());
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
        "{indent}if (x_ok && y_ok) sum += {}[x_at] * {}[y_at];",
        a.tensor, b.tensor
    );
    for _ in &c.reduction {
        indent.truncate(indent.len() - 2);
        let _ = writeln!(src, "{indent}}}");
    }
    if let Some(bias) = &c.bias {
        access_lines(bias, "z", "  ", &mut src);
        let _ = writeln!(src, "  sum += {}[z_at];", bias.tensor);
    }
    if c.relu {
        let _ = writeln!(src, "  sum = fmaxf(sum, 0.0f);");
    }
    let _ = writeln!(src, "  out[o] = sum;");
    let _ = writeln!(src, "}}");
    GeneratedKernel {
        name,
        source: src,
        launch: LaunchConfig {
            grid: outputs.div_ceil(u64::from(BLOCK)) as u32,
            block: BLOCK,
            dynamic_shared_bytes: 0,
            zero_output: false,
        },
    }
}
