//! The assembly game as the agents see it (CuAsmRL's formulation): the state is a
//! matrix with one row per instruction of the kernel, an action is a (row, direction)
//! pair that swaps a memory instruction with its neighbour above or below, only legal
//! actions may be chosen, and the reward of a step is the measured relative gain
//! `(T_prev − T_new) / T_0 × 100`. The agents (PPO, greedy, annealing) are written
//! against this trait, so they can be tested on small synthetic games without a GPU.
//! The moves themselves, and which are legal, are `legality::moves` and `legality::order`.

use crate::legality::moves::Action;

/// What one step gave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// `(T_prev − T_new) / T_0 × 100`; −1 when the candidate failed validation.
    pub reward: f32,
    /// The episode ended (its move budget is spent, no legal move is left, a candidate
    /// failed, or the measurement budget is exhausted).
    pub done: bool,
}

/// The environment. Implementations measure on the GPU (`search`) or are synthetic
/// (tests).
pub trait Game {
    /// Rows of the observation (instructions of the kernel); constant for a game.
    fn rows(&self) -> usize;
    /// Features per row; constant for a game.
    fn columns(&self) -> usize;
    /// The current state, row-major `rows × columns`.
    fn observation(&self) -> Vec<f32>;
    /// Legality of every action index (`2 * rows` entries).
    fn legal(&self) -> Vec<bool>;
    /// Applies a legal action. Errors are infrastructure failures (the GPU is gone),
    /// not bad candidates: those come back as a step with reward −1.
    fn step(&mut self, action: Action) -> Result<Step, crate::SassError>;
    /// Starts a new episode from the stage-1 order.
    fn reset(&mut self);
    /// Whether the measurement budget is spent (no further steps will be measured).
    fn exhausted(&self) -> bool;
}
