//! The one ranking of a task's records: correct records by median time, fastest first,
//! records of equal time in log order. `best`'s summaries and the path to a kernel
//! (`kernel`) both rank through [`Fastest`], so they agree on the best record; it keeps
//! only the head of the ranking as records stream past, so ranking a log takes memory
//! bounded by its tasks, not its length.

use crate::record::Record;
use std::borrow::Borrow;

/// How many of a task's fastest correct records `export` and `deploy add` keep while
/// reading a log, for `best_regenerated` to fall back on. A record read from a log was
/// already validated against its device (`validate`), which is what regeneration
/// checks, so a kept record that does not regenerate is rare: 16 leave ample room, at
/// about 12 KB a record (the ResNet logs) some 200 KB a task.
pub const KEEP: usize = 16;

/// The `keep` fastest correct records offered so far, fastest first; of records with
/// equal times, the one offered first ranks first. Failed records are not ranked.
#[derive(Debug, Clone)]
pub struct Fastest<R> {
    keep: usize,
    ranked: Vec<R>,
}

impl<R: Borrow<Record>> Fastest<R> {
    pub fn new(keep: usize) -> Self {
        Fastest {
            keep,
            ranked: Vec::new(),
        }
    }

    /// Ranks `record` among those kept (dropping it, or the slowest kept, past `keep`).
    pub fn offer(&mut self, record: R) {
        let Some(us) = record.borrow().median_us() else {
            return;
        };
        // After every kept record no slower: ties stay in the order offered.
        let at = self
            .ranked
            .partition_point(|r| r.borrow().median_us().is_some_and(|t| t <= us));
        if at < self.keep {
            self.ranked.insert(at, record);
            self.ranked.truncate(self.keep);
        }
    }

    /// The kept records, fastest first.
    pub fn into_ranked(self) -> Vec<R> {
        self.ranked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::{ok, record};
    use gpu::{ErrorKind, Outcome};

    /// A correct record of `us` tagged `tag` (in its timestamp).
    fn tagged(tag: &str, us: f64) -> Record {
        let mut r = record("64,64,64", 1, ok(us));
        r.timestamp = tag.into();
        r
    }

    fn tags<R: Borrow<Record>>(f: Fastest<R>) -> Vec<String> {
        let ranked = f.into_ranked();
        ranked
            .iter()
            .map(|r| r.borrow().timestamp.clone())
            .collect()
    }

    #[test]
    fn the_fastest_are_kept_in_order_and_failures_never() {
        let mut f = Fastest::new(3);
        for (tag, us) in [
            ("a", 30.0),
            ("b", 10.0),
            ("c", 40.0),
            ("d", 20.0),
            ("e", 5.0),
        ] {
            f.offer(tagged(tag, us));
        }
        f.offer(record(
            "64,64,64",
            6,
            Outcome::error(ErrorKind::Timeout, "x"),
        ));
        // Slower than every kept record of a full list: dropped.
        f.offer(tagged("f", 25.0));
        assert_eq!(tags(f), ["e", "b", "d"]);
        let mut f = Fastest::new(3);
        f.offer(record(
            "64,64,64",
            6,
            Outcome::error(ErrorKind::Timeout, "x"),
        ));
        assert!(f.into_ranked().is_empty());
    }

    #[test]
    fn ties_keep_the_order_offered() {
        let mut f = Fastest::new(3);
        for tag in ["a", "b", "c", "d"] {
            f.offer(tagged(tag, 7.0));
        }
        assert_eq!(tags(f), ["a", "b", "c"]);
        // A faster record goes first, an equal one after its equals; borrowed records
        // rank the same way.
        let rs = [
            tagged("a", 7.0),
            tagged("b", 7.0),
            tagged("fast", 1.0),
            tagged("c", 7.0),
            tagged("slow", 9.0),
        ];
        let mut f = Fastest::new(4);
        for r in &rs {
            f.offer(r);
        }
        assert_eq!(tags(f), ["fast", "a", "b", "c"]);
    }
}
