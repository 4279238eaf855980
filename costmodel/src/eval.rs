//! How well a model ranks: Spearman rank correlation, pairwise accuracy and top-k
//! recall, computed on held-out measurements of one task.

/// Ranks (1-based, ties get their average rank).
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut out = vec![0.0; values.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && values[order[j + 1]] == values[order[i]] {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            out[k] = rank;
        }
        i = j + 1;
    }
    out
}

/// Spearman's rank correlation of `a` and `b` (None with fewer than 3 values or no
/// variation).
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() != b.len() || a.len() < 3 {
        return None;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let mean = (n + 1.0) / 2.0;
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        cov += (x - mean) * (y - mean);
        va += (x - mean) * (x - mean);
        vb += (y - mean) * (y - mean);
    }
    (va > 0.0 && vb > 0.0).then(|| cov / (va * vb).sqrt())
}

/// Of the `k` highest `truth` values, the share that are among the `k` highest
/// `predicted` ones.
pub fn top_k_recall(truth: &[f64], predicted: &[f64], k: usize) -> Option<f64> {
    let k = k.min(truth.len());
    if k == 0 {
        return None;
    }
    let top = |v: &[f64]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
        idx.truncate(k);
        idx
    };
    let (t, p) = (top(truth), top(predicted));
    Some(t.iter().filter(|i| p.contains(i)).count() as f64 / k as f64)
}

/// Of the pairs of measurements whose `truth` differs, the share that `predicted`
/// orders the same way (a tie in `predicted` counts half): 0.5 for random scores.
pub fn pairwise_accuracy(truth: &[f64], predicted: &[f64]) -> Option<f64> {
    let (mut right, mut pairs) = (0.0, 0u64);
    for i in 0..truth.len() {
        for j in i + 1..truth.len() {
            if truth[i] == truth[j] {
                continue;
            }
            pairs += 1;
            let (t, p) = (truth[i] > truth[j], predicted[i].total_cmp(&predicted[j]));
            right += match p {
                std::cmp::Ordering::Equal => 0.5,
                std::cmp::Ordering::Greater if t => 1.0,
                std::cmp::Ordering::Less if !t => 1.0,
                _ => 0.0,
            };
        }
    }
    (pairs > 0).then(|| right / pairs as f64)
}

/// Of the `k` highest `truth` values, the share among the `among` highest `predicted`
/// ones: with `k` 10 and `among` 64, how many of the task's ten fastest candidates a
/// round of 64 proposed by the model would measure.
pub fn recall_among(truth: &[f64], predicted: &[f64], k: usize, among: usize) -> Option<f64> {
    let k = k.min(truth.len());
    if k == 0 {
        return None;
    }
    let top = |v: &[f64], n: usize| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
        idx.truncate(n);
        idx
    };
    let (t, p) = (top(truth, k), top(predicted, among));
    Some(t.iter().filter(|i| p.contains(i)).count() as f64 / k as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_of_monotone_reversed_and_tied_data() {
        let a = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(spearman(&a, &[10.0, 20.0, 30.0, 400.0]), Some(1.0));
        assert_eq!(spearman(&a, &[4.0, 3.0, 2.0, 1.0]), Some(-1.0));
        assert_eq!(ranks(&[5.0, 1.0, 5.0]), vec![2.5, 1.0, 2.5]);
        assert_eq!(spearman(&a, &[1.0; 4]), None);
        assert_eq!(spearman(&[1.0, 2.0], &[1.0, 2.0]), None);
        let r = spearman(&[1.0, 2.0, 3.0, 4.0, 5.0], &[2.0, 1.0, 4.0, 3.0, 5.0]).unwrap();
        assert!((r - 0.8).abs() < 1e-12, "{r}");
    }

    #[test]
    fn recall_counts_the_true_best_found_in_the_predicted_best() {
        let truth = [0.9, 0.1, 0.8, 0.2, 0.7];
        assert_eq!(top_k_recall(&truth, &truth, 2), Some(1.0));
        assert_eq!(
            top_k_recall(&truth, &[0.0, 1.0, 0.9, 0.5, 0.1], 2),
            Some(0.5)
        );
        assert_eq!(top_k_recall(&[], &[], 3), None);
    }

    #[test]
    fn pairwise_accuracy_counts_pairs_in_the_right_order() {
        let truth = [3.0, 2.0, 1.0];
        assert_eq!(pairwise_accuracy(&truth, &truth), Some(1.0));
        assert_eq!(pairwise_accuracy(&truth, &[1.0, 2.0, 3.0]), Some(0.0));
        assert_eq!(pairwise_accuracy(&truth, &[0.0; 3]), Some(0.5));
        assert_eq!(pairwise_accuracy(&[1.0, 1.0], &[1.0, 2.0]), None);
        // Among 4: the true best two are the predicted 2nd and 4th.
        let predicted = [0.5, 0.1, 0.9, 0.0];
        assert_eq!(
            recall_among(&[4.0, 3.0, 2.0, 1.0], &predicted, 2, 2),
            Some(0.5)
        );
        assert_eq!(
            recall_among(&[4.0, 3.0, 2.0, 1.0], &predicted, 2, 4),
            Some(1.0)
        );
    }
}
