//! The index arithmetic layouts are written in: non-negative integers with addition,
//! multiplication, floor division and remainder by constants, and XOR. A layout written
//! once against [`IndexAlgebra`] is evaluated as numbers ([`Numbers`]: the interpreter,
//! the features, validation), built as IR expressions (`Scope`: lowering, with its range
//! simplifications) or printed as C ([`CText`]: code generation).

use crate::expr::{Expr, Scope};

/// Index arithmetic over some representation of values.
pub trait IndexAlgebra {
    type Value: Clone;
    fn add(&self, a: Self::Value, b: Self::Value) -> Self::Value;
    fn mul(&self, a: Self::Value, c: i64) -> Self::Value;
    /// Floor division by a positive constant (operands are never negative).
    fn div(&self, a: Self::Value, c: i64) -> Self::Value;
    /// Remainder by a positive constant (operands are never negative).
    fn rem(&self, a: Self::Value, c: i64) -> Self::Value;
    fn xor(&self, a: Self::Value, b: Self::Value) -> Self::Value;
    fn constant(&self, c: i64) -> Self::Value;
}

/// Plain numbers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Numbers;

impl IndexAlgebra for Numbers {
    type Value = i64;
    fn add(&self, a: i64, b: i64) -> i64 {
        a + b
    }
    fn mul(&self, a: i64, c: i64) -> i64 {
        a * c
    }
    fn div(&self, a: i64, c: i64) -> i64 {
        a / c
    }
    fn rem(&self, a: i64, c: i64) -> i64 {
        a % c
    }
    fn xor(&self, a: i64, b: i64) -> i64 {
        a ^ b
    }
    fn constant(&self, c: i64) -> i64 {
        c
    }
}

/// IR expressions, simplified as `Scope` builds them.
impl IndexAlgebra for Scope {
    type Value = Expr;
    fn add(&self, a: Expr, b: Expr) -> Expr {
        Scope::add(self, a, b)
    }
    fn mul(&self, a: Expr, c: i64) -> Expr {
        Scope::mul(self, a, c)
    }
    fn div(&self, a: Expr, c: i64) -> Expr {
        Scope::div(self, a, c)
    }
    fn rem(&self, a: Expr, c: i64) -> Expr {
        Scope::rem(self, a, c)
    }
    fn xor(&self, a: Expr, b: Expr) -> Expr {
        Scope::xor(self, a, b)
    }
    fn constant(&self, c: i64) -> Expr {
        Expr::Const(c)
    }
}

/// C source text.
#[derive(Debug, Clone, Copy, Default)]
pub struct CText;

/// A C expression and whether it stands as an operand without parentheses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct C {
    pub text: String,
    atomic: bool,
}

impl C {
    /// Any C expression: parenthesized wherever it is an operand.
    pub fn expr(text: impl Into<String>) -> C {
        C {
            text: text.into(),
            atomic: false,
        }
    }

    fn operand(&self) -> String {
        if self.atomic {
            self.text.clone()
        } else {
            format!("({})", self.text)
        }
    }

    fn compound(text: String) -> C {
        C {
            text,
            atomic: false,
        }
    }
}

/// Products, quotients and remainders parenthesize their non-atomic operand; an XOR is
/// parenthesized whole and parenthesizes both operands (C's `^` binds looser than `+`);
/// sums join their terms as they are.
impl IndexAlgebra for CText {
    type Value = C;
    fn add(&self, a: C, b: C) -> C {
        C::compound(format!("{} + {}", a.text, b.text))
    }
    fn mul(&self, a: C, c: i64) -> C {
        C::compound(format!("{} * {c}", a.operand()))
    }
    fn div(&self, a: C, c: i64) -> C {
        C::compound(format!("{} / {c}", a.operand()))
    }
    fn rem(&self, a: C, c: i64) -> C {
        C::compound(format!("{} % {c}", a.operand()))
    }
    fn xor(&self, a: C, b: C) -> C {
        C {
            text: format!("({} ^ {})", a.operand(), b.operand()),
            atomic: true,
        }
    }
    fn constant(&self, c: i64) -> C {
        C {
            text: c.to_string(),
            atomic: c >= 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_text_parenthesizes_operands_and_xors() {
        let (row, col) = (C::expr("r + 1"), C::expr("c"));
        let a = CText;
        let chunk = a.xor(a.div(col.clone(), 8), a.rem(a.div(row.clone(), 2), 4));
        assert_eq!(chunk.text, "(((c) / 8) ^ (((r + 1) / 2) % 4))");
        let sum = a.add(a.mul(row, 64), a.mul(chunk, 8));
        assert_eq!(
            sum.text,
            "(r + 1) * 64 + (((c) / 8) ^ (((r + 1) / 2) % 4)) * 8"
        );
    }
}
