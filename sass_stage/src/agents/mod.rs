//! The searches that choose an order: the assembly game the agents play (`game`, with
//! its observation in `embed` and its measured environment in `env`), what they
//! optimise (`objective`), the analytical estimate that ranks moves (`estimate`), and
//! the agents themselves: PPO (`ppo`), greedy hill climbing (`greedy`) and simulated
//! annealing (`anneal`). They see the GPU only through an `Objective`, so each can be
//! tested on synthetic objectives and games.

pub mod anneal;
pub mod candidates;
pub mod embed;
pub mod env;
pub mod estimate;
pub mod game;
pub mod greedy;
pub mod model;
pub mod objective;
pub mod ppo;
