//! The stage's report over all kernels of a run: `sass.json` (every kernel's result) and
//! `sass.md` (one table row per kernel, each agent's final time, the winner, the
//! geometric-mean speedup and the wins per agent). Pure functions of the results, so the
//! Markdown is checked by a snapshot test.

use crate::stage::{AgentKind, KernelResult, MIN_GAIN};
use serde::Serialize;
use std::fmt::Write as _;

/// One kernel's result, under its task key.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub task: String,
    #[serde(flatten)]
    pub result: KernelResult,
}

/// A guided agent against its unguided twin over all kernels: the geometric-mean gain
/// each found in its search and the measurements each spent to come within 0.5% of its
/// own best.
#[derive(Debug, Clone, Serialize)]
pub struct ModelComparison {
    pub guided: AgentKind,
    pub unguided: AgentKind,
    pub guided_gain: f64,
    pub unguided_gain: f64,
    pub guided_measurements_to_best: usize,
    pub unguided_measurements_to_best: usize,
    pub guided_skipped: usize,
}

/// The run over all kernels.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub device: String,
    pub budget: usize,
    pub rounds: usize,
    pub geomean_speedup: f64,
    /// Measurements of every agent over every kernel.
    pub measurements: usize,
    /// Candidates that failed their exact check or faulted (recorded, never shipped).
    pub failed_candidates: usize,
    /// Each model-guided agent against its unguided twin, where both ran.
    pub model_comparison: Vec<ModelComparison>,
    pub kernels: Vec<Row>,
    /// The agents that ran, in the order of the table's columns.
    #[serde(skip)]
    pub agents: Vec<AgentKind>,
}

impl Report {
    /// The report of `kernels`, with the geometric mean of their speedups.
    pub fn new(
        device: String,
        budget: usize,
        rounds: usize,
        agents: Vec<AgentKind>,
        kernels: Vec<Row>,
    ) -> Report {
        let geomean_speedup = (kernels.iter().map(|r| r.result.speedup.ln()).sum::<f64>()
            / kernels.len().max(1) as f64)
            .exp();
        let all = || kernels.iter().flat_map(|r| &r.result.agents);
        let measurements = all().map(|a| a.measurements).sum();
        let failed_candidates = all().map(|a| a.failures.len()).sum();
        let model_comparison = [
            (AgentKind::GreedyModel, AgentKind::Greedy),
            (AgentKind::AnnealModel, AgentKind::Anneal),
        ]
        .into_iter()
        .filter(|(g, u)| agents.contains(g) && agents.contains(u))
        .map(|(guided, unguided)| {
            let of = |kind: AgentKind| -> Vec<&crate::stage::AgentResult> {
                kernels
                    .iter()
                    .filter_map(|r| r.result.agents.iter().find(|a| a.agent == kind))
                    .collect()
            };
            let gain = |rs: &[&crate::stage::AgentResult]| {
                (rs.iter()
                    .map(|a| (a.curve[0] / a.search_best_us).ln())
                    .sum::<f64>()
                    / rs.len().max(1) as f64)
                    .exp()
            };
            let (g, u) = (of(guided), of(unguided));
            ModelComparison {
                guided,
                unguided,
                guided_gain: gain(&g),
                unguided_gain: gain(&u),
                guided_measurements_to_best: g.iter().map(|a| a.measurements_to_best).sum(),
                unguided_measurements_to_best: u.iter().map(|a| a.measurements_to_best).sum(),
                guided_skipped: g.iter().map(|a| a.skipped_by_model).sum(),
            }
        })
        .collect();
        Report {
            device,
            budget,
            rounds,
            geomean_speedup,
            measurements,
            failed_candidates,
            model_comparison,
            kernels,
            agents,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports always serialize")
    }

    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# Stage 2 (SASS reordering and control bits) on {}\n",
            self.device
        );
        let _ = writeln!(
            s,
            "Budget {} distinct measurements per agent and task (shared among its stage-1 kernels under `--top-k`); final times are medians of {} \
             alternating rounds (stage-1 order and each agent's validated best, same process); \
             a reordering replaces stage 1 only when faster by more than {:.1}%.\n",
            self.budget,
            self.rounds,
            100.0 * MIN_GAIN
        );
        let mut header = "| task | instr. | legal moves | stage 1 µs |".to_string();
        let mut rule = "|---|---:|---:|---:|".to_string();
        for a in &self.agents {
            let _ = write!(header, " {} µs |", a.name());
            rule.push_str("---:|");
        }
        header.push_str(" final µs | speedup | winner | stage-1 rank | edits | validations |");
        rule.push_str("---:|---:|---|---:|---|---:|");
        let _ = writeln!(s, "{header}\n{rule}");
        for row in &self.kernels {
            let r = &row.result;
            let mut line = format!(
                "| {} | {} | {} | {:.2} |",
                row.task, r.instructions, r.legal_at_start, r.stage1_us
            );
            for a in &self.agents {
                let cell = match r.agents.iter().find(|x| x.agent == *a) {
                    Some(x) => match (x.final_us, &x.rejected) {
                        (Some(t), _) => format!("{t:.2}"),
                        (None, Some(_)) => "rejected".to_string(),
                        (None, None) => "–".to_string(),
                    },
                    None => "–".to_string(),
                };
                let _ = write!(line, " {cell} |");
            }
            let edits: Vec<String> = r.actions.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(
                s,
                "{line} {:.2} | {:.3}x | {} | {} | {} | {} |",
                r.final_us,
                r.speedup,
                r.winner.map_or("stage 1", |w| w.name()),
                r.stage1_rank,
                if edits.is_empty() {
                    "–".to_string()
                } else {
                    edits.join(", ")
                },
                r.validations
            );
        }
        let _ = writeln!(
            s,
            "\nGeometric-mean speedup over stage 1: **{:.3}x**.",
            self.geomean_speedup
        );
        let _ = writeln!(
            s,
            "\nWhere each final kernel's hot loop spends its issue cycles (sum of stall \
             counts per iteration, by instruction class; integer address arithmetic is \
             stage 1's to remove, no reordering can):\n"
        );
        for k in &self.kernels {
            let _ = writeln!(s, "- {}: {}", k.task, k.result.hot_loop.line());
        }
        let _ = writeln!(s);
        let wins = |a: AgentKind| {
            self.kernels
                .iter()
                .filter(|r| r.result.winner == Some(a))
                .count()
        };
        let _ = writeln!(
            s,
            "Measurements: {} over all agents and kernels; candidates that failed the exact \
             check or faulted: {} (recorded, never kept).",
            self.measurements, self.failed_candidates
        );
        for c in &self.model_comparison {
            let _ = writeln!(
                s,
                "Model: {} reached a search gain of {:.3}x in {} measurements (to within 0.5% \
                 of its best, summed over kernels; {} candidates skipped on the model's \
                 word); {} reached {:.3}x in {}.",
                c.guided.name(),
                c.guided_gain,
                c.guided_measurements_to_best,
                c.guided_skipped,
                c.unguided.name(),
                c.unguided_gain,
                c.unguided_measurements_to_best
            );
        }
        let _ = writeln!(
            s,
            "Wins: {}.",
            self.agents
                .iter()
                .map(|&a| format!("{} {}", a.name(), wins(a)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legality::order::Order;
    use crate::legality::profile::{ClassShare, IssueProfile};
    use crate::stage::{AgentResult, Moved};

    fn agent(agent: AgentKind, final_us: Option<f64>, rejected: Option<&str>) -> AgentResult {
        AgentResult {
            agent,
            measurements: 12,
            failures: vec![],
            search_best_us: final_us.unwrap_or(10.0),
            curve: vec![10.0, 9.9],
            rejected: rejected.map(str::to_string),
            final_us,
            moved: 2,
            actions: [("moved".to_string(), 2)].into_iter().collect(),
            measurements_to_best: 1,
            skipped_by_model: 0,
            order: Order::identity(4),
        }
    }

    fn kernel(
        task: &str,
        stage1_us: f64,
        final_us: f64,
        winner: Option<AgentKind>,
        agents: Vec<AgentResult>,
    ) -> Row {
        Row {
            task: task.to_string(),
            result: KernelResult {
                kernel: task.to_string(),
                instructions: 412,
                movable: 96,
                legal_at_start: 57,
                stage1_us,
                agents,
                winner,
                final_us,
                speedup: stage1_us / final_us,
                validations: 31,
                explain: winner
                    .map(|_| {
                        vec![Moved {
                            text: "LDS.128 R4, [R2+0x40]".into(),
                            from: 40,
                            to: 37,
                        }]
                    })
                    .unwrap_or_default(),
                control_edits: vec![],
                stage1_rank: 0,
                ranks: vec![],
                actions: winner
                    .map(|_| {
                        [("moved".to_string(), 1), ("yield".to_string(), 4)]
                            .into_iter()
                            .collect()
                    })
                    .unwrap_or_default(),
                hot_loop: IssueProfile {
                    block: 3,
                    instructions: 83,
                    cycles: 259,
                    classes: [
                        ("mma/fma", 16, 93),
                        ("memory", 16, 49),
                        ("integer", 51, 117),
                    ]
                    .into_iter()
                    .map(|(class, instructions, cycles)| ClassShare {
                        class,
                        instructions,
                        cycles,
                    })
                    .collect(),
                },
                order: Order::identity(4),
            },
        }
    }

    #[test]
    fn the_markdown_report_is_stable() {
        let agents = vec![AgentKind::Ppo, AgentKind::Greedy, AgentKind::Anneal];
        let report = Report::new(
            "NVIDIA H100 80GB HBM3".into(),
            40,
            5,
            agents,
            vec![
                kernel(
                    "conv2d_n1_c512_h7_w7_k512_r3_s3_st1_p1",
                    20.0,
                    19.5,
                    Some(AgentKind::Greedy),
                    vec![
                        agent(AgentKind::Ppo, Some(19.9), None),
                        agent(AgentKind::Greedy, Some(19.5), None),
                        agent(AgentKind::Anneal, None, Some("input seed 102: output[3]")),
                    ],
                ),
                kernel(
                    "matmul_m64_n64_k64",
                    5.0,
                    5.0,
                    None,
                    vec![agent(AgentKind::Ppo, Some(5.01), None)],
                ),
            ],
        );
        assert!((report.geomean_speedup - (20.0f64 / 19.5).sqrt()).abs() < 1e-12);
        insta::assert_snapshot!(report.to_markdown());
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(
            json["kernels"][0]["task"],
            "conv2d_n1_c512_h7_w7_k512_r3_s3_st1_p1"
        );
        assert_eq!(json["kernels"][0]["winner"], "greedy");
        assert!(json.get("agents").is_none());
    }
}
