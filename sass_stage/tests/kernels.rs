//! The stage on real kernels compiled here with NVRTC for sm_90 (no GPU needed):
//! the original order verifies, random legal walks stay legal, and a reordered cubin
//! disassembles to exactly the original lines with the moved ones exchanged.

use sass_stage::decode::cubin::Cubin;
use sass_stage::decode::disasm::disassemble;
use sass_stage::legality::analysis::Kernel;
use sass_stage::legality::moves::Kind;
use sass_stage::legality::order::Order;

/// (cubin, kernel name) of sampled states of a few ResNet layers: float32 CUDA-core
/// kernels, then fp16 NHWC tensor-core kernels (HMMA, LDSM, LDGSTS; or HGMMA, UTMALDG
/// and mbarriers).
fn kernels() -> Vec<(Vec<u8>, String)> {
    use schedule::{DType, Layout};
    let gpu = schedule::GpuSpec::h100();
    let mut out = Vec::new();
    for (shape, seed, dtype) in [
        ("1,64,56,56,64,3,3,1,1", 1, DType::F32),
        ("1,256,14,14,256,3,3,1,1", 2, DType::F32),
        ("1,512,7,7,2048,1,1,1,0", 3, DType::F32),
        ("8,64,56,56,64,3,3,1,1", 4, DType::Fp16),
        ("8,256,14,14,256,3,3,1,1", 5, DType::Fp16),
    ] {
        let op = schedule::parse_shape("conv2d", shape).unwrap();
        let task = schedule::Task::new(op, schedule::Epilogue::default())
            .unwrap()
            .with_types(
                dtype,
                dtype,
                if dtype == DType::F32 {
                    Layout::Nchw
                } else {
                    Layout::Nhwc
                },
            )
            .unwrap();
        for state in schedule::Sampler::new(&task, &gpu, seed).sample_distinct(2) {
            let k = schedule::generate(&task, &state, &gpu).unwrap();
            // `wgmma` states (convolutions too, since issue 30) build for sm_90a.
            let arch = k.launch.target.arch("sm_90");
            let compiled = gpu::compile(&k.source, &k.name, &arch).unwrap();
            out.push((compiled.cubin, k.name));
        }
    }
    out
}

fn analyze(cubin: &Cubin, name: &str) -> Kernel {
    let text = cubin.kernel(name).unwrap();
    let lines = disassemble(cubin.bytes(), name).unwrap();
    Kernel::analyze(&text, &lines).unwrap()
}

/// The order after a seeded random walk of up to `steps` legal actions of every kind.
fn walk(kernel: &Kernel, steps: usize, seed: u64) -> Order {
    kernel.replay(&kernel.random_walk(steps, seed))
}

/// The order after a seeded random walk of up to `steps` legal swaps only.
fn swaps(kernel: &Kernel, steps: usize, seed: u64) -> Order {
    kernel.replay(&kernel.random_walk_of(steps, seed, &[Kind::Up, Kind::Down]))
}

fn without_reuse(text: &str) -> String {
    text.replace(".reuse", "")
}

#[test]
fn real_kernels_analyse_and_random_legal_walks_verify() {
    let mut movable_somewhere = false;
    let mut tensor_core = 0;
    for (bytes, name) in kernels() {
        let cubin = Cubin::parse(bytes).unwrap();
        let kernel = analyze(&cubin, &name);
        tensor_core += usize::from(
            kernel
                .instructions
                .iter()
                .any(|i| i.base == "HMMA" || i.base == "HGMMA"),
        );
        assert_eq!(
            kernel.verify(&Order::identity(kernel.len())),
            Ok(()),
            "{name}"
        );
        let legal = kernel
            .legal_mask(&Order::identity(kernel.len()))
            .iter()
            .filter(|&&l| l)
            .count();
        movable_somewhere |= legal > 0;
        for seed in 0..3 {
            let order = walk(&kernel, 60, seed);
            assert_eq!(kernel.verify(&order), Ok(()), "{name} seed {seed}");
        }
    }
    assert!(movable_somewhere, "no legal move in any kernel");
    assert_eq!(tensor_core, 4, "the fp16 kernels run on tensor cores");
}

#[test]
fn a_reordered_cubin_disassembles_to_the_moved_lines_and_keeps_pinned_offsets() {
    for (bytes, name) in kernels().into_iter().take(3) {
        let cubin = Cubin::parse(bytes).unwrap();
        let text = cubin.kernel(&name).unwrap();
        let kernel = analyze(&cubin, &name);
        let order = swaps(&kernel, 40, 7);
        assert!(!order.moved().is_empty(), "{name}: the walk moved nothing");
        let rewritten = cubin.with_text(&text, &kernel.words(&order));
        assert_eq!(rewritten.len(), cubin.bytes().len());
        // Only the text section's bytes changed.
        let range = text.file_offset..text.file_offset + 16 * text.words.len();
        for (i, (a, b)) in cubin.bytes().iter().zip(&rewritten).enumerate() {
            assert!(
                a == b || range.contains(&i),
                "byte {i} outside the text changed"
            );
        }
        let again = Cubin::parse(rewritten).unwrap();
        let lines = disassemble(again.bytes(), &name).unwrap();
        for (p, line) in lines.iter().enumerate() {
            let original = &kernel.instructions[order.at(p)];
            assert_eq!(
                without_reuse(&line.text),
                without_reuse(&original.text),
                "{name} @{p}"
            );
            assert_eq!(line.low, original.low);
        }
        for (i, pin) in kernel.pinned.iter().enumerate() {
            if pin.is_some() {
                assert_eq!(order.position(i), i, "{name}: pinned {i} moved");
            }
        }
        // The rewritten kernel analyses again, and the move back to the original
        // order is legal in it as a whole.
        let reanalysed = Kernel::analyze(&again.kernel(&name).unwrap(), &lines).unwrap();
        assert_eq!(reanalysed.verify(&Order::identity(lines.len())), Ok(()));
    }
}

#[test]
fn control_edits_disassemble_to_the_same_instructions_with_the_edited_bits() {
    let mut edited_somewhere = false;
    for (bytes, name) in kernels() {
        let cubin = Cubin::parse(bytes).unwrap();
        let text = cubin.kernel(&name).unwrap();
        let kernel = analyze(&cubin, &name);
        for seed in 0..2 {
            let order = walk(&kernel, 200, seed);
            edited_somewhere |= order.edits().next().is_some();
            let again = Cubin::parse(cubin.with_text(&text, &kernel.words(&order))).unwrap();
            let lines = disassemble(again.bytes(), &name)
                .unwrap_or_else(|e| panic!("{name} seed {seed}: {e}"));
            for (p, line) in lines.iter().enumerate() {
                let original = &kernel.instructions[order.at(p)];
                assert_eq!(
                    without_reuse(&line.text),
                    without_reuse(&original.text),
                    "{name} @{p}"
                );
                let decoded = sass_stage::decode::control::Control::decode(line.high);
                assert_eq!(decoded, kernel.effective_control(&order, p), "{name} @{p}");
            }
            let reanalysed = Kernel::analyze(&again.kernel(&name).unwrap(), &lines).unwrap();
            assert_eq!(reanalysed.verify(&Order::identity(lines.len())), Ok(()));
        }
    }
    assert!(edited_somewhere, "no walk edited any control bits");
}

#[test]
fn the_verifier_rejects_a_hand_made_illegal_swap() {
    let (bytes, name) = kernels().remove(0);
    let cubin = Cubin::parse(bytes).unwrap();
    let kernel = analyze(&cubin, &name);
    let (from, to, _) = kernel
        .graph
        .all_edges()
        .find(|&(a, b, _)| b == a + 1)
        .expect("some adjacent pair depends on each other");
    let mut order = Order::identity(kernel.len());
    order.swap(from as usize);
    assert!(kernel.verify(&order).is_err(), "{from} -> {to}");
}

#[test]
fn bad_inputs_give_one_clear_error() {
    let (bytes, name) = kernels().remove(0);
    let cubin = Cubin::parse(bytes.clone()).unwrap();
    let e = cubin.kernel("no_such_kernel").unwrap_err().to_string();
    assert!(
        e.contains("no_such_kernel is not in the cubin") && e.contains(&name),
        "{e}"
    );
    // An sm_80 cubin of the same kernel is refused.
    let gpu = schedule::GpuSpec::h100();
    let op = schedule::parse_shape("conv2d", "1,64,56,56,64,3,3,1,1").unwrap();
    let task = schedule::Task::new(op, schedule::Epilogue::default()).unwrap();
    let state = schedule::Sampler::new(&task, &gpu, 1).sample().unwrap();
    let k = schedule::generate(&task, &state, &gpu).unwrap();
    if let Ok(old) = gpu::compile(&k.source, &k.name, "sm_80") {
        let e = Cubin::parse(old.cubin).unwrap_err().to_string();
        assert!(e.contains("sm_80") && e.contains("sm_90 only"), "{e}");
    }
    let mut corrupt = bytes;
    corrupt.truncate(100);
    assert!(Cubin::parse(corrupt).is_err());
}
