//! On a real GPU (ignored in CI): the warpgroup MMA atom (`schedule::atom::wgmma`) is
//! what the hardware does. A probe kernel, written from the atom's data alone, fills two
//! K-major fp16 and bf16 tiles (64×64 of A, n×64 of B) into shared memory through the
//! 128-byte swizzle of `SharedTileLayout`, multiplies them with four
//! `wgmma.mma_async` k16 steps whose descriptors the atom encodes, and stores the
//! accumulators through the atom's (thread, value) → (row, column) map. The result must
//! equal A·Bᵀ computed on the CPU exactly (small integers), for several n. Compiled for
//! the arch-specific target (`Target::ArchSpecific`: sm_90a). Needs NVRTC and a Hopper
//! GPU.

mod common;

use schedule::atom::SharedTileLayout;
use schedule::atom::wgmma::{COMMIT_C, FENCE_C, Swizzle, WARPGROUP_THREADS, WgmmaAtom, wait_c};
use schedule::{DType, LaunchConfig, Target};
use std::fmt::Write;

const K: i64 = 64;

/// The probe kernel for a 64×n product of the atom's operand type.
fn probe(atom: &WgmmaAtom, n: i64) -> String {
    let layout = |rows| SharedTileLayout {
        rows,
        row_elements: K,
        chunk_elements: 8,
        swizzle: true,
    };
    let (a, b) = (layout(atom.m), layout(n));
    let swizzle = Swizzle::of(&a, 2).expect("a 128-byte row");
    let d = WgmmaAtom::accumulator(n);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void wgmma_probe(const unsigned short* __restrict__ a, \
         const unsigned short* __restrict__ b, float* __restrict__ d) {{"
    );
    let _ = writeln!(
        s,
        "  __shared__ __align__(1024) unsigned short a_sh[{}];",
        a.elements()
    );
    let _ = writeln!(
        s,
        "  __shared__ __align__(1024) unsigned short b_sh[{}];",
        b.elements()
    );
    let _ = writeln!(s, "  const int t = threadIdx.x;");
    for (name, l) in [("a", a), ("b", b)] {
        let _ = writeln!(
            s,
            "  for (int i = t; i < {}; i += {WARPGROUP_THREADS}) {{ const int r = i / {K}, c = i % {K}; \
             {name}_sh[{}] = {name}[i]; }}",
            l.elements(),
            l.c("r", "c")
        );
    }
    s.push_str("  asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n");
    s.push_str("  __syncthreads();\n");
    let _ = writeln!(s, "  float acc[{}];", d.values);
    let _ = writeln!(s, "  for (int v = 0; v < {}; ++v) acc[v] = 0.0f;", d.values);
    s.push_str("  const unsigned a0 = (unsigned)__cvta_generic_to_shared(a_sh);\n");
    s.push_str("  const unsigned b0 = (unsigned)__cvta_generic_to_shared(b_sh);\n");
    let _ = writeln!(s, "  {FENCE_C}");
    for issue in atom.k_tile_c(n, "acc", ("a0", "b0"), swizzle) {
        let _ = writeln!(s, "  {issue}");
    }
    let _ = writeln!(s, "  {COMMIT_C}\n  {}", wait_c(0));
    for v in 0..d.values {
        let _ = writeln!(
            s,
            "  d[({}) * {n} + ({})] = acc[{v}];",
            schedule::atom::fragment::lane_c(d.row, "t") + &value_part(d.row, v),
            schedule::atom::fragment::lane_c(d.column, "t") + &value_part(d.column, v),
        );
    }
    s.push_str("}\n");
    s
}

/// The value terms of a coordinate at value `v`, as ` + constant`.
fn value_part(terms: &[schedule::atom::Term], v: i64) -> String {
    let constant: i64 = terms
        .iter()
        .filter(|t| t.index == schedule::atom::Index::Value)
        .map(|t| t.apply(&schedule::atom::Numbers, v))
        .sum();
    format!(" + {constant}")
}

/// The probes compile for sm_90a without spilling (NVRTC only, no GPU): what the GPU
/// test runs is valid PTX for the arch-specific target.
#[test]
fn the_probes_compile_for_the_arch_specific_target() {
    let arch = Target::ArchSpecific.arch("sm_90");
    for dtype in [DType::Fp16, DType::Bf16] {
        let atom = WgmmaAtom::for_dtype(dtype).expect("a half type");
        for n in [8, 64, 136, 256] {
            let compiled = gpu::compile(&probe(atom, n), "wgmma_probe", &arch)
                .unwrap_or_else(|e| panic!("{dtype:?} n={n}: {e}"));
            assert_eq!(compiled.resources.spill_store_bytes, 0, "{dtype:?} n={n}");
        }
    }
}

#[test]
#[ignore = "needs a Hopper GPU"]
fn the_wgmma_atom_multiplies_as_the_hardware_does() {
    let (ctx, device) = common::gpu();
    let arch = Target::ArchSpecific.arch(&device.arch());
    for dtype in [DType::Fp16, DType::Bf16] {
        let atom = WgmmaAtom::for_dtype(dtype).expect("a half type");
        for n in [8, 64, 136, 256] {
            assert!(WgmmaAtom::n_valid(n));
            let source = probe(atom, n);
            let compiled = gpu::compile(&source, "wgmma_probe", &arch)
                .unwrap_or_else(|e| panic!("{dtype:?} n={n}: {e}\n{source}"));
            let module = ctx.load(&compiled.cubin).expect("load");
            let function = module.function("wgmma_probe", 0).expect("the probe");
            // Small integers: every product and sum is exact in the types and in f32.
            let a: Vec<f32> = (0..atom.m * K).map(|i| ((i * 7) % 9 - 4) as f32).collect();
            let b: Vec<f32> = (0..n * K).map(|i| ((i * 5) % 7 - 3) as f32).collect();
            let (a_buf, b_buf) = (
                ctx.alloc_typed(a.len(), dtype).unwrap(),
                ctx.alloc_typed(b.len(), dtype).unwrap(),
            );
            ctx.upload(&a_buf, &a).unwrap();
            ctx.upload(&b_buf, &b).unwrap();
            let d_buf = ctx.alloc((atom.m * n) as usize).unwrap();
            ctx.poison(&d_buf).unwrap();
            let launch = LaunchConfig {
                target: Target::ArchSpecific,
                ..LaunchConfig::linear(1, WARPGROUP_THREADS as u32, 0)
            };
            ctx.launch(&function, &launch, &[&a_buf, &b_buf, &d_buf], &[])
                .expect("launch");
            let got = ctx.download(&d_buf).expect("download");
            for m in 0..atom.m {
                for j in 0..n {
                    let want: f32 = (0..K)
                        .map(|k| a[(m * K + k) as usize] * b[(j * K + k) as usize])
                        .sum();
                    assert_eq!(
                        got[(m * n + j) as usize],
                        want,
                        "{dtype:?} n={n}: D[{m}][{j}]"
                    );
                }
            }
        }
    }
}
