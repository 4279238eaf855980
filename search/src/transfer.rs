//! Transfer: a new task's first round measures the best states of its nearest tuned
//! tasks in the kernel database (`records::database`), each adapted to the new shape by
//! its sketch (`schedule::adapt`); the evolution then mutates from what survives. The
//! database never supplies the task's own records (`KernelDb::nearest` leaves them
//! out), so a tuned figure never comes from its own earlier tunes.

use records::KernelDb;
use schedule::{GpuSpec, State, Task};
use std::collections::HashSet;

/// Tuned tasks a new task starts from, and states of each.
pub const NEAREST: usize = 3;
pub const STATES_PER_TASK: usize = 4;

/// Up to `NEAREST × STATES_PER_TASK` distinct valid states of `task` on `gpu` (compute
/// capability `cc`, named `name`): the fastest states of its nearest tuned tasks,
/// nearest task first, each adapted to `task`; states that do not adapt are skipped.
pub fn starting_states(
    db: &KernelDb,
    task: &Task,
    gpu: &GpuSpec,
    cc: (u32, u32),
    name: &str,
) -> Vec<State> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for tuned in db.nearest(task, cc, name, NEAREST) {
        let adapted = tuned
            .states
            .iter()
            .filter_map(|(_, s)| schedule::adapt(s, task, gpu).ok())
            .filter(|s| seen.insert(s.id()))
            .take(STATES_PER_TASK);
        out.extend(adapted);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use records::database::Entry;
    use schedule::{DType, Layout, Operator, Sampler};

    fn matmul(m: u32, n: u32, k: u32) -> Task {
        Task::new(Operator::Matmul { m, n, k }, Default::default())
            .and_then(|t| t.with_types(DType::Fp16, DType::Fp16, Layout::Nchw))
            .unwrap()
    }

    #[test]
    fn a_new_task_starts_from_its_neighbours_states_adapted() {
        let gpu = GpuSpec::h100();
        let mut db = KernelDb::default();
        let tuned = [matmul(4096, 4096, 4096), matmul(2048, 4096, 4096)];
        for (i, t) in tuned.iter().enumerate() {
            for (j, s) in Sampler::new(t, &gpu, i as u64)
                .sample_distinct(10)
                .into_iter()
                .enumerate()
            {
                db.offer(Entry {
                    task: *t,
                    gpu: "g".into(),
                    cc: (9, 0),
                    us: j as f64,
                    state: s,
                });
            }
        }
        let new = matmul(3072, 4096, 4096);
        let states = starting_states(&db, &new, &gpu, (9, 0), "g");
        assert!(!states.is_empty() && states.len() <= 2 * STATES_PER_TASK);
        for s in &states {
            assert!(schedule::validate(&new.contraction(), s, &gpu).is_ok());
        }
        // A tuned task starts from the other one's states, never from its own.
        let own = starting_states(&db, &tuned[0], &gpu, (9, 0), "g");
        let other: HashSet<String> = db.nearest(&tuned[0], (9, 0), "g", NEAREST)[0]
            .states
            .iter()
            .filter_map(|(_, s)| schedule::adapt(s, &tuned[0], &gpu).ok())
            .map(|s| s.id())
            .collect();
        assert!(!own.is_empty() && own.iter().all(|s| other.contains(&s.id())));
        // Another compute capability has nothing to give.
        assert!(starting_states(&db, &new, &gpu, (8, 0), "g").is_empty());
    }
}
