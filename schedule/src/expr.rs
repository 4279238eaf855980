//! Integer index expressions and the `Scope` that builds them: every variable's range
//! is known, so building simplifies (constant folding, dropping divisions and remainders
//! that cannot change the value) and proves bounds. They sit below the IR (`ir`) and the
//! atoms (`atom`), which both build index expressions: an atom's layout never needs the
//! IR's statements.

/// A variable: a loop counter or a `const int` binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Var(pub usize);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Const(i64),
    Var(Var),
    BlockIdx,
    ThreadIdx,
    Add(Box<Expr>, Box<Expr>),
    /// Multiplication by a constant.
    Mul(Box<Expr>, i64),
    /// Floor division by a positive constant (operands are never negative).
    Div(Box<Expr>, i64),
    /// Remainder by a positive constant (operands are never negative).
    Rem(Box<Expr>, i64),
    /// Bitwise exclusive or of two non-negative operands (the shared-memory swizzle).
    Xor(Box<Expr>, Box<Expr>),
    /// The smaller of two operands.
    Min(Box<Expr>, Box<Expr>),
}

/// `lo <= expr < hi`, where a missing bound needs no check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub expr: Expr,
    pub lo: Option<i64>,
    pub hi: Option<i64>,
}

/// A variable's name and inclusive value range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarInfo {
    pub name: String,
    pub lo: i64,
    pub hi: i64,
}

/// Builds expressions with range knowledge. `grid` and `threads` bound the block and
/// thread indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub vars: Vec<VarInfo>,
    pub grid: i64,
    pub threads: i64,
}

impl Scope {
    pub fn new(grid: i64, threads: i64) -> Self {
        Scope {
            vars: Vec::new(),
            grid,
            threads,
        }
    }

    /// A new variable with a name unique in the kernel.
    pub fn var(&mut self, name: &str, lo: i64, hi: i64) -> Var {
        let mut unique = name.to_string();
        let mut n = 1;
        while self.vars.iter().any(|v| v.name == unique) {
            n += 1;
            unique = format!("{name}_{n}");
        }
        self.vars.push(VarInfo {
            name: unique,
            lo,
            hi,
        });
        Var(self.vars.len() - 1)
    }

    /// Inclusive range of an expression's value.
    pub fn range(&self, e: &Expr) -> (i64, i64) {
        match e {
            Expr::Const(c) => (*c, *c),
            Expr::Var(v) => (self.vars[v.0].lo, self.vars[v.0].hi),
            Expr::BlockIdx => (0, self.grid - 1),
            Expr::ThreadIdx => (0, self.threads - 1),
            Expr::Add(a, b) => {
                let (a0, a1) = self.range(a);
                let (b0, b1) = self.range(b);
                (a0 + b0, a1 + b1)
            }
            Expr::Mul(a, c) => {
                let (a0, a1) = self.range(a);
                if *c >= 0 {
                    (a0 * c, a1 * c)
                } else {
                    (a1 * c, a0 * c)
                }
            }
            Expr::Div(a, c) => {
                let (a0, a1) = self.range(a);
                (a0.div_euclid(*c), a1.div_euclid(*c))
            }
            Expr::Rem(a, c) => {
                let (a0, a1) = self.range(a);
                if a0 >= 0 && a1 < *c {
                    (a0, a1)
                } else {
                    (0, c - 1)
                }
            }
            Expr::Min(a, b) => {
                let ((a0, a1), (b0, b1)) = (self.range(a), self.range(b));
                (a0.min(b0), a1.min(b1))
            }
            Expr::Xor(a, b) => {
                let hi = self.range(a).1.max(self.range(b).1).max(0);
                // Below the next power of two of the larger operand.
                (0, ((hi + 1) as u64).next_power_of_two() as i64 - 1)
            }
        }
    }

    pub fn min(&self, a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (Expr::Const(x), Expr::Const(y)) => Expr::Const(x.min(y)),
            (a, b) => Expr::Min(Box::new(a), Box::new(b)),
        }
    }

    pub fn xor(&self, a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (Expr::Const(x), Expr::Const(y)) => Expr::Const(x ^ y),
            (e, Expr::Const(0)) | (Expr::Const(0), e) => e,
            (a, b) => Expr::Xor(Box::new(a), Box::new(b)),
        }
    }

    pub fn add(&self, a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (Expr::Const(x), Expr::Const(y)) => Expr::Const(x + y),
            (Expr::Const(0), e) | (e, Expr::Const(0)) => e,
            // Keep constants rightmost and merged: (e + c1) + c2 = e + (c1 + c2).
            (Expr::Add(e, c1), Expr::Const(c2)) if matches!(*c1, Expr::Const(_)) => {
                let Expr::Const(c1) = *c1 else { unreachable!() };
                self.add(*e, Expr::Const(c1 + c2))
            }
            (Expr::Const(c), e) => Expr::Add(Box::new(e), Box::new(Expr::Const(c))),
            (a, Expr::Add(e, c)) if matches!(*c, Expr::Const(_)) => {
                let sum = self.add(a, *e);
                self.add(sum, *c)
            }
            (Expr::Add(e, c), b) if matches!(*c, Expr::Const(_)) => {
                let sum = self.add(*e, b);
                self.add(sum, *c)
            }
            (a, b) => Expr::Add(Box::new(a), Box::new(b)),
        }
    }

    pub fn sum(&self, terms: impl IntoIterator<Item = Expr>) -> Expr {
        terms
            .into_iter()
            .fold(Expr::Const(0), |acc, t| self.add(acc, t))
    }

    pub fn mul(&self, a: Expr, c: i64) -> Expr {
        match (a, c) {
            (_, 0) => Expr::Const(0),
            (a, 1) => a,
            (Expr::Const(x), c) => Expr::Const(x * c),
            (Expr::Mul(e, x), c) => Expr::Mul(e, x * c),
            (Expr::Add(e, k), c) if matches!(*k, Expr::Const(_)) => {
                let Expr::Const(k) = *k else { unreachable!() };
                let scaled = self.mul(*e, c);
                self.add(scaled, Expr::Const(k * c))
            }
            (a, c) => Expr::Mul(Box::new(a), c),
        }
    }

    pub fn div(&self, a: Expr, c: i64) -> Expr {
        let (lo, hi) = self.range(&a);
        match (a, c) {
            (a, 1) => a,
            (Expr::Const(x), c) => Expr::Const(x.div_euclid(c)),
            (_, c) if lo >= 0 && hi < c => Expr::Const(0),
            (Expr::Mul(e, x), c) if x % c == 0 => self.mul(*e, x / c),
            // (e*x)/c = e/(c/x) when x divides c (operands are non-negative).
            (Expr::Mul(e, x), c) if x > 0 && c % x == 0 => self.div(*e, c / x),
            (Expr::Div(e, x), c) => self.div(*e, x * c),
            (a, c) => Expr::Div(Box::new(a), c),
        }
    }

    pub fn rem(&self, a: Expr, c: i64) -> Expr {
        let (lo, hi) = self.range(&a);
        match (a, c) {
            (_, 1) => Expr::Const(0),
            (Expr::Const(x), c) => Expr::Const(x.rem_euclid(c)),
            (a, c) if lo >= 0 && hi < c => a,
            (Expr::Mul(_, x), c) if x % c == 0 => Expr::Const(0),
            // (e*x)%c = (e%(c/x))*x when x divides c.
            (Expr::Mul(e, x), c) if x > 0 && c % x == 0 => self.mul(self.rem(*e, c / x), x),
            (a, c) => Expr::Rem(Box::new(a), c),
        }
    }

    /// The checks needed for `lo <= e < hi`, none when the range already proves it.
    pub fn bound(&self, e: &Expr, lo: i64, hi: i64) -> Option<Cond> {
        let (min, max) = self.range(e);
        let lo = (min < lo).then_some(lo);
        let hi = (max >= hi).then_some(hi);
        (lo.is_some() || hi.is_some()).then(|| Cond {
            expr: e.clone(),
            lo,
            hi,
        })
    }
}
