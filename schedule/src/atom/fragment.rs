//! Per-lane fragments as data: which element of a small matrix each lane holds, as a
//! (lane, value) → (row, column) map, each coordinate a sum of [`Term`]s. The same map
//! is evaluated as numbers (interpreter, features), built as expressions (lowering, in
//! any [`IndexAlgebra`]) and printed as C (code generation).

use super::algebra::IndexAlgebra;

/// What a term reads: the lane in the warp, or the value's index in the lane's fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Index {
    Lane,
    Value,
}

/// `((index / div) % modulus) * scale`; a `modulus` of 0 takes no remainder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    pub index: Index,
    pub div: i64,
    pub modulus: i64,
    pub scale: i64,
}

impl Term {
    pub const fn new(index: Index, div: i64, modulus: i64, scale: i64) -> Term {
        Term {
            index,
            div,
            modulus,
            scale,
        }
    }

    /// The term of `x` in an algebra (steps that change nothing are not taken).
    pub fn apply<A: IndexAlgebra>(&self, a: &A, x: A::Value) -> A::Value {
        let x = if self.div == 1 { x } else { a.div(x, self.div) };
        let x = if self.modulus == 0 {
            x
        } else {
            a.rem(x, self.modulus)
        };
        if self.scale == 1 {
            x
        } else {
            a.mul(x, self.scale)
        }
    }

    /// The term printed over the C name `x` without parentheses, e.g. `lane / 8 % 2 * 8`
    /// (C's `/`, `%` and `*` associate to the left).
    pub fn c(&self, x: &str) -> String {
        let mut text = x.to_string();
        if self.div != 1 {
            text += &format!(" / {}", self.div);
        }
        if self.modulus != 0 {
            text += &format!(" % {}", self.modulus);
        }
        if self.scale != 1 {
            text += &format!(" * {}", self.scale);
        }
        text
    }

    /// The term scaled by `factor` (a coordinate in 16-byte chunks, in elements).
    pub const fn scaled(self, factor: i64) -> Term {
        Term {
            scale: self.scale * factor,
            ..self
        }
    }
}

/// A coordinate: the sum of its terms.
pub type Coordinate = &'static [Term];

/// A (lane, value) → (row, column) map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentLayout {
    pub row: Coordinate,
    pub column: Coordinate,
    /// Values per lane.
    pub values: i64,
}

/// The sum of `terms` that read `index`, of `x`, in an algebra (`None` when none do).
pub fn part<A: IndexAlgebra>(a: &A, terms: &[Term], index: Index, x: A::Value) -> Option<A::Value> {
    terms
        .iter()
        .filter(|t| t.index == index)
        .map(|t| t.apply(a, x.clone()))
        .reduce(|s, t| a.add(s, t))
}

/// The terms of `terms` that read the lane, printed over `lane` and joined by ` + `.
pub fn lane_c(terms: &[Term], lane: &str) -> String {
    terms
        .iter()
        .filter(|t| t.index == Index::Lane)
        .map(|t| t.c(lane))
        .collect::<Vec<_>>()
        .join(" + ")
}

/// The value of `terms` at (lane, value).
pub fn at(terms: &[Term], lane: i64, value: i64) -> i64 {
    terms
        .iter()
        .map(|t| {
            let x = match t.index {
                Index::Lane => lane,
                Index::Value => value,
            };
            t.apply(&super::Numbers, x)
        })
        .sum()
}

impl FragmentLayout {
    /// (row, column) of value `value` of lane `lane`.
    pub fn coord(&self, lane: i64, value: i64) -> (i64, i64) {
        (at(self.row, lane, value), at(self.column, lane, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::atom::algebra::{C, CText};

    #[test]
    fn terms_print_evaluate_and_build_alike() {
        let t = Term::new(Index::Lane, 8, 2, 8);
        assert_eq!(t.c("lane"), "lane / 8 % 2 * 8");
        assert_eq!(t.apply(&super::super::Numbers, 13), 8);
        assert_eq!(t.apply(&CText, C::expr("l")).text, "(((l) / 8) % 2) * 8");
        let plain = Term::new(Index::Lane, 1, 16, 1);
        assert_eq!(plain.c("lane"), "lane % 16");
        let terms = [
            plain,
            Term::new(Index::Lane, 16, 0, 8),
            Term::new(Index::Value, 1, 0, 4),
        ];
        assert_eq!(lane_c(&terms, "lane"), "lane % 16 + lane / 16 * 8");
        assert_eq!(at(&terms, 21, 1), 5 + 8 + 4);
    }
}
