//! Training data: feature rows with the task and measured time of each, and the label
//! derived from them.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Feature rows (flattened, `width` per row) of measured candidates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    pub width: usize,
    pub rows: Vec<f32>,
    /// The task of each row.
    pub tasks: Vec<String>,
    /// The measured median of each row, or None for a failed candidate.
    pub us: Vec<Option<f64>>,
}

impl Dataset {
    pub fn new(width: usize) -> Self {
        Dataset {
            width,
            ..Default::default()
        }
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn push(&mut self, features: &[f32], task: &str, us: Option<f64>) {
        assert_eq!(features.len(), self.width, "feature row width");
        self.rows.extend_from_slice(features);
        self.tasks.push(task.to_string());
        self.us.push(us);
    }

    pub fn extend(&mut self, other: &Dataset) {
        assert_eq!(other.width, self.width, "feature row width");
        self.rows.extend_from_slice(&other.rows);
        self.tasks.extend(other.tasks.iter().cloned());
        self.us.extend(other.us.iter().copied());
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.rows[i * self.width..(i + 1) * self.width]
    }

    /// The rows at `indices`, as a new dataset.
    pub fn select(&self, indices: &[usize]) -> Dataset {
        let mut out = Dataset::new(self.width);
        for &i in indices {
            out.push(self.row(i), &self.tasks[i], self.us[i]);
        }
        out
    }

    pub fn labels(&self) -> Vec<f32> {
        normalized_throughput(&self.tasks, &self.us)
    }
}

/// Best time of the row's task / the row's time (1 for the fastest of each task, 0 for
/// failures).
pub fn normalized_throughput(tasks: &[String], us: &[Option<f64>]) -> Vec<f32> {
    let mut best: HashMap<&str, f64> = HashMap::new();
    for (t, u) in tasks.iter().zip(us) {
        if let Some(u) = u.filter(|u| *u > 0.0) {
            let b = best.entry(t.as_str()).or_insert(u);
            *b = b.min(u);
        }
    }
    tasks
        .iter()
        .zip(us)
        .map(|(t, u)| match u {
            Some(u) if *u > 0.0 => (best[t.as_str()] / u) as f32,
            _ => 0.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_throughput_relative_to_the_best_of_each_task() {
        let tasks: Vec<String> = ["a", "a", "b", "a", "b"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let us = [Some(10.0), Some(20.0), Some(100.0), None, Some(50.0)];
        assert_eq!(
            normalized_throughput(&tasks, &us),
            vec![1.0, 0.5, 0.5, 0.0, 1.0]
        );
    }

    #[test]
    fn select_keeps_rows_with_their_task_and_time() {
        let mut d = Dataset::new(2);
        d.push(&[1.0, 2.0], "a", Some(1.0));
        d.push(&[3.0, 4.0], "b", None);
        let s = d.select(&[1]);
        assert_eq!(
            (s.rows.as_slice(), s.tasks[0].as_str(), s.us[0]),
            (&[3.0, 4.0][..], "b", None)
        );
    }
}
