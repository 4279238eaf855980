//! Helpers of the `wgmma` sketch's interpreter tests: tasks, states and the check of a
//! lowered kernel against the definition on small integers (`run` and `edit_all` serve
//! the row-span tests too).

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use schedule::interp::{self, Inputs};
use schedule::ir::{Kernel, Stmt};
use schedule::state::WgmmaTiling;
use schedule::{
    DType, Epilogue, GpuSpec, Layout, State, Task, lower::lower, parse_shape, validate,
};

pub fn task(op: &str, shape: &str, dtype: DType, epilogue: Epilogue) -> Task {
    Task::new(parse_shape(op, shape).unwrap(), epilogue)
        .unwrap()
        .with_types(dtype, dtype, Layout::Nhwc)
        .unwrap()
}

/// Runs `kernel` on small integers and returns the interpreter's error or the first
/// wrong output element.
pub fn run(task: &Task, kernel: &Kernel) -> Result<(), String> {
    let c = task.contraction();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut ints =
        |n: u64| -> Vec<f32> { (0..n).map(|_| (rng.next_u32() % 5) as f32 - 2.0).collect() };
    let (a, b) = (ints(c.inputs[0].elements()), ints(c.inputs[1].elements()));
    let bias = c.bias.as_ref().map(|x| ints(x.elements()));
    let inputs = Inputs {
        inputs: [&a, &b],
        bias: bias.as_deref(),
    };
    let expected = interp::reference(&c, &inputs);
    let got = interp::run(kernel, &inputs, expected.len()).map_err(|e| e.to_string())?;
    match (0..got.len()).find(|&i| got[i] != expected[i]) {
        Some(i) => Err(format!("output {i} is {} not {}", got[i], expected[i])),
        None => Ok(()),
    }
}

pub fn tiling(
    consumers: u32,
    m_atoms: u32,
    block_n: u32,
    k_bytes: u32,
    stages: u32,
) -> WgmmaTiling {
    WgmmaTiling {
        consumers,
        m_atoms,
        block_n,
        k_bytes,
        stages,
        in_flight: u32::from(stages > 1),
        persistent: 0,
        producer_warp: 0,
        raster: 0,
        cluster: 0,
        cluster_m: 0,
        tma_store: 0,
        stream_k: 0,
    }
}

/// Checks `tilings` (those valid for the task) and returns how many ran.
pub fn check(task: &Task, tilings: &[WgmmaTiling]) -> usize {
    let split: Vec<(WgmmaTiling, u32)> = tilings.iter().map(|t| (*t, 1)).collect();
    check_split(task, &split)
}

/// `State::hopper(tiling)` with its reduction split `split_k` ways.
pub fn split_state(t: WgmmaTiling, split_k: u32) -> State {
    State {
        split_k,
        ..State::hopper(t)
    }
}

/// Checks states of `tilings` with their splits (those valid for the task) and
/// returns how many ran.
pub fn check_split(task: &Task, tilings: &[(WgmmaTiling, u32)]) -> usize {
    let states: Vec<State> = tilings.iter().map(|&(t, k)| split_state(t, k)).collect();
    check_states(task, &states)
}

/// Checks `states` (those valid for the task; each invalid one's reason printed) and
/// returns how many ran.
pub fn check_states(task: &Task, states: &[State]) -> usize {
    let (c, gpu) = (task.contraction(), GpuSpec::h100());
    let mut ran = 0;
    for state in states {
        if let Err(e) = validate(&c, state, &gpu) {
            eprintln!("skipped {}: {e}", state.to_json());
            continue;
        }
        let kernel = lower(task, state);
        if let Err(e) = run(task, &kernel) {
            panic!("{task} {}: {e}", state.to_json());
        }
        ran += 1;
    }
    ran
}

/// Applies `edit` to every statement (nested bodies included); returns how many it
/// changed.
pub fn edit_all(body: &mut [Stmt], edit: &impl Fn(&mut Stmt) -> bool) -> usize {
    let mut changed = 0;
    for stmt in body {
        changed += usize::from(edit(stmt));
        if let Some(body) = stmt.body_mut() {
            changed += edit_all(body, edit);
        }
    }
    changed
}
