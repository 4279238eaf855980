//! The PPO agent that plays the assembly game (CuAsmRL's agent, CleanRL-style PPO,
//! written from scratch on candle, CPU only).
//!
//! The network reads the observation as a sequence of instructions: a stack of 1-D
//! convolutions runs along the instruction axis, so one set of weights works for a
//! kernel of any length, and every row's features decide that row's action logits
//! (the two moves and the control edits, `moves::Kind`) locally. A value head mean-pools the rows. Illegal moves are masked to a
//! large negative logit before the softmax, so they get probability exactly 0 and are
//! never sampled, and the log-probabilities and entropy used in the loss are those of
//! the masked distribution. All randomness (weights and sampling) comes from one seed,
//! so a run can be repeated action for action.

use candle_core::backprop::GradStore;
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

use crate::SassError;
use crate::agents::game::Game;
use crate::legality::moves::{Action, KINDS};

/// Logit given to illegal actions: finite (unlike −∞) so that `0 · log p` stays 0 in
/// the entropy and no NaN reaches the gradients, yet `exp` of it underflows to exactly 0.
const MASKED_LOGIT: f32 = -1e9;
/// Width of the convolutions along the instruction axis (two neighbours each side).
const KERNEL: usize = 5;
/// Separates the sampling stream from the weight-initialisation stream of one seed.
const SAMPLING_STREAM: u64 = 0x9e37_79b9_7f4a_7c15;

/// Hyper-parameters; the defaults are CuAsmRL's (see `shared/REFERENCE.md`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PpoConfig {
    /// Moves per episode. The game enforces its own limit; the rollout also ends an
    /// episode here so that a game without one cannot run forever.
    pub episode_length: usize,
    /// Environment steps collected per update.
    pub steps_per_update: usize,
    pub minibatch_size: usize,
    pub epochs: usize,
    /// Initial learning rate, annealed linearly to 0 over the run.
    pub learning_rate: f64,
    pub gamma: f32,
    pub gae_lambda: f32,
    pub clip: f32,
    pub entropy_coef: f32,
    pub value_coef: f32,
    pub max_grad_norm: f32,
    /// Normalise advantages within each minibatch (CleanRL's default).
    pub normalize_advantages: bool,
    /// Channels of the convolutional encoder.
    pub hidden: usize,
    /// Convolution layers of the encoder.
    pub conv_layers: usize,
    pub seed: u64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            episode_length: 32,
            steps_per_update: 64,
            minibatch_size: 8,
            epochs: 4,
            learning_rate: 2.5e-4,
            gamma: 0.99,
            gae_lambda: 0.95,
            clip: 0.2,
            entropy_coef: 0.01,
            value_coef: 0.5,
            max_grad_norm: 0.5,
            normalize_advantages: true,
            hidden: 32,
            conv_layers: 3,
            seed: 0,
        }
    }
}

/// What a training run did, for logging.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PpoReport {
    /// Environment steps taken.
    pub steps: usize,
    /// Policy updates done.
    pub updates: usize,
    /// Episodes finished.
    pub episodes: usize,
    /// Undiscounted return of every finished episode, in order.
    pub episode_returns: Vec<f32>,
    /// Mean clipped-surrogate loss of every update.
    pub policy_loss: Vec<f32>,
    /// Mean value loss of every update.
    pub value_loss: Vec<f32>,
    /// Mean entropy of the masked policy of every update.
    pub entropy: Vec<f32>,
}

fn tool(e: candle_core::Error) -> SassError {
    SassError::Tool(format!("ppo: {e}"))
}

/// Uniform in `[0, 1)` from the top 53 bits.
fn uniform(rng: &mut impl Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Weights uniform in `±gain·√(3 / fan_in)` (variance `gain² / fan_in`), drawn from
/// the seeded generator because candle's CPU generator cannot be seeded.
fn init_var(
    rng: &mut ChaCha8Rng,
    shape: &[usize],
    fan_in: usize,
    gain: f64,
    device: &Device,
) -> candle_core::Result<Var> {
    let bound = gain * (3.0 / fan_in.max(1) as f64).sqrt();
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| ((2.0 * uniform(rng) - 1.0) * bound) as f32)
        .collect();
    Var::from_vec(data, shape, device)
}

fn zeros_var(n: usize, device: &Device) -> candle_core::Result<Var> {
    Var::zeros(n, DType::F32, device)
}

/// The actor-critic network.
#[derive(Debug, Clone)]
pub struct Policy {
    device: Device,
    columns: usize,
    hidden: usize,
    /// `(weight [out, in, KERNEL], bias [out])` per convolution.
    convs: Vec<(Var, Var)>,
    /// Per-row 1×1 convolution to the two move logits: `[2, hidden, 1]`, `[2]`.
    pi_w: Var,
    pi_b: Var,
    /// Value MLP on the pooled features: `[hidden, hidden]`, `[hidden]`, `[1, hidden]`, `[1]`.
    v1_w: Var,
    v1_b: Var,
    v2_w: Var,
    v2_b: Var,
}

impl Policy {
    /// A fresh network for observations with `columns` features per row.
    pub fn new(
        columns: usize,
        hidden: usize,
        conv_layers: usize,
        seed: u64,
    ) -> Result<Policy, SassError> {
        if columns == 0 || hidden == 0 || conv_layers == 0 {
            return Err(SassError::Input(
                "ppo: columns, hidden and conv_layers must be positive".into(),
            ));
        }
        Self::build(columns, hidden, conv_layers, seed).map_err(tool)
    }

    fn build(
        columns: usize,
        hidden: usize,
        conv_layers: usize,
        seed: u64,
    ) -> candle_core::Result<Policy> {
        let device = Device::Cpu;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let relu_gain = 2f64.sqrt();
        let mut convs = Vec::with_capacity(conv_layers);
        for layer in 0..conv_layers {
            let input = if layer == 0 { columns } else { hidden };
            let w = init_var(
                &mut rng,
                &[hidden, input, KERNEL],
                input * KERNEL,
                relu_gain,
                &device,
            )?;
            convs.push((w, zeros_var(hidden, &device)?));
        }
        // A tiny policy head starts near the uniform distribution over legal moves
        // (CleanRL's 0.01 gain), so early exploration is not biased by the init.
        let pi_w = init_var(&mut rng, &[KINDS, hidden, 1], hidden, 0.01, &device)?;
        let pi_b = zeros_var(KINDS, &device)?;
        let v1_w = init_var(&mut rng, &[hidden, hidden], hidden, relu_gain, &device)?;
        let v1_b = zeros_var(hidden, &device)?;
        let v2_w = init_var(&mut rng, &[1, hidden], hidden, 1.0, &device)?;
        let v2_b = zeros_var(1, &device)?;
        Ok(Policy {
            device,
            columns,
            hidden,
            convs,
            pi_w,
            pi_b,
            v1_w,
            v1_b,
            v2_w,
            v2_b,
        })
    }

    /// Features per row this network reads.
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// Every trainable variable.
    pub fn vars(&self) -> Vec<Var> {
        let mut vars: Vec<Var> = self
            .convs
            .iter()
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect();
        vars.extend([
            self.pi_w.clone(),
            self.pi_b.clone(),
            self.v1_w.clone(),
            self.v1_b.clone(),
            self.v2_w.clone(),
            self.v2_b.clone(),
        ]);
        vars
    }

    /// Unmasked logits `[batch, KINDS·rows]` (index `KINDS·row + kind`) and values
    /// `[batch]` of observations `[batch, rows, columns]`.
    pub fn forward(&self, obs: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        let (batch, rows, _) = obs.dims3()?;
        // Channels first: the convolutions slide along the instruction axis.
        let mut x = obs.transpose(1, 2)?.contiguous()?;
        for (w, b) in &self.convs {
            x = x
                .conv1d(w, KERNEL / 2, 1, 1, 1)?
                .broadcast_add(&b.reshape((1, self.hidden, 1))?)?
                .relu()?;
        }
        let logits = x
            .conv1d(&self.pi_w, 0, 1, 1, 1)?
            .broadcast_add(&self.pi_b.reshape((1, KINDS, 1))?)?
            // [batch, KINDS, rows] → [batch, rows, KINDS] → row-major KINDS·row + kind.
            .transpose(1, 2)?
            .contiguous()?
            .reshape((batch, KINDS * rows))?;
        let pooled = x.mean(2)?;
        let h = pooled
            .matmul(&self.v1_w.t()?)?
            .broadcast_add(&self.v1_b)?
            .relu()?;
        let value = h
            .matmul(&self.v2_w.t()?)?
            .broadcast_add(&self.v2_b)?
            .squeeze(1)?;
        Ok((logits, value))
    }

    fn check(
        &self,
        obs: &[f32],
        rows: usize,
        columns: usize,
        legal: &[bool],
    ) -> Result<(), SassError> {
        if columns != self.columns {
            return Err(SassError::Input(format!(
                "ppo: observation has {columns} columns, the network reads {}",
                self.columns
            )));
        }
        if obs.len() != rows * columns || legal.len() != KINDS * rows {
            return Err(SassError::Input(format!(
                "ppo: observation of {} values and mask of {} for {rows} rows × {columns} columns",
                obs.len(),
                legal.len()
            )));
        }
        if !legal.iter().any(|&l| l) {
            return Err(SassError::Input("ppo: no legal action".into()));
        }
        Ok(())
    }

    /// Masked log-probabilities `[KINDS·rows]` and the value of one observation.
    fn evaluate(
        &self,
        obs: &[f32],
        rows: usize,
        columns: usize,
        legal: &[bool],
    ) -> Result<(Vec<f32>, f32), SassError> {
        self.check(obs, rows, columns, legal)?;
        let run = || -> candle_core::Result<(Vec<f32>, f32)> {
            let x = Tensor::from_slice(obs, (1, rows, columns), &self.device)?;
            let bias = mask_bias(legal, 1, KINDS * rows, &self.device)?;
            let (logits, value) = self.forward(&x)?;
            let log_probs = masked_log_softmax(&logits, &bias)?;
            Ok((
                log_probs.squeeze(0)?.to_vec1()?,
                value.squeeze(0)?.to_scalar()?,
            ))
        };
        run().map_err(tool)
    }

    /// Action probabilities (index `KINDS·row + kind`) in a state; illegal ones are 0.
    pub fn distribution(
        &self,
        obs: &[f32],
        rows: usize,
        columns: usize,
        legal: &[bool],
    ) -> Result<Vec<f32>, SassError> {
        let (log_probs, _) = self.evaluate(obs, rows, columns, legal)?;
        Ok(log_probs.iter().map(|l| l.exp()).collect())
    }

    /// Samples a legal action; returns it with its log-probability and the state's value.
    pub fn act(
        &self,
        obs: &[f32],
        rows: usize,
        columns: usize,
        legal: &[bool],
        rng: &mut impl Rng,
    ) -> Result<(Action, f32, f32), SassError> {
        let (log_probs, value) = self.evaluate(obs, rows, columns, legal)?;
        let index = sample(&log_probs, legal, uniform(rng));
        Ok((Action::from_index(index), log_probs[index], value))
    }
}

/// Inverse-CDF sampling restricted to legal actions: an illegal action is never
/// returned, even when rounding leaves the cumulative sum short of `u`.
fn sample(log_probs: &[f32], legal: &[bool], u: f64) -> usize {
    let mut cumulative = 0.0f64;
    let mut last_legal = 0;
    for (i, (&lp, &ok)) in log_probs.iter().zip(legal).enumerate() {
        if !ok {
            continue;
        }
        last_legal = i;
        cumulative += f64::from(lp.exp());
        if u < cumulative {
            return i;
        }
    }
    last_legal
}

/// Additive mask: 0 for legal actions, `MASKED_LOGIT` for illegal ones.
fn mask_bias(
    legal: &[bool],
    batch: usize,
    actions: usize,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let data: Vec<f32> = legal
        .iter()
        .map(|&ok| if ok { 0.0 } else { MASKED_LOGIT })
        .collect();
    Tensor::from_vec(data, (batch, actions), device)
}

/// Log-softmax of the logits with illegal actions pushed to `MASKED_LOGIT`.
fn masked_log_softmax(logits: &Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::ops::log_softmax(&(logits + bias)?, D::Minus1)
}

/// Generalised advantage estimates and returns. `dones[t]` says the episode ended
/// after step `t`; `next_value` is the value of the state after the last step
/// (ignored when that step ended an episode).
fn gae(
    rewards: &[f32],
    values: &[f32],
    dones: &[bool],
    next_value: f32,
    gamma: f32,
    lambda: f32,
) -> (Vec<f32>, Vec<f32>) {
    let n = rewards.len();
    let mut advantages = vec![0.0f32; n];
    let mut last = 0.0f32;
    for t in (0..n).rev() {
        let nonterminal = if dones[t] { 0.0 } else { 1.0 };
        let next = if t + 1 < n { values[t + 1] } else { next_value };
        let delta = rewards[t] + gamma * next * nonterminal - values[t];
        last = delta + gamma * lambda * nonterminal * last;
        advantages[t] = last;
    }
    let returns = advantages.iter().zip(values).map(|(a, v)| a + v).collect();
    (advantages, returns)
}

/// One rollout's transitions.
#[derive(Default)]
struct Rollout {
    obs: Vec<f32>,
    legal: Vec<bool>,
    actions: Vec<u32>,
    log_probs: Vec<f32>,
    values: Vec<f32>,
    rewards: Vec<f32>,
    dones: Vec<bool>,
}

impl Rollout {
    fn len(&self) -> usize {
        self.actions.len()
    }
}

/// Scales the gradients so that their global L2 norm is at most `max_norm`.
fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f32) -> candle_core::Result<()> {
    let mut squares = 0.0f64;
    for var in vars {
        if let Some(g) = grads.get(var) {
            squares += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
        }
    }
    let norm = squares.sqrt();
    if norm > f64::from(max_norm) {
        let scale = f64::from(max_norm) / (norm + 1e-6);
        for var in vars {
            if let Some(g) = grads.remove(var) {
                grads.insert(var, (g * scale)?);
            }
        }
    }
    Ok(())
}

/// Losses of one minibatch, for the report.
struct Losses {
    policy: f32,
    value: f32,
    entropy: f32,
}

/// One gradient step on the transitions `batch` of the rollout.
#[allow(clippy::too_many_arguments)]
fn minibatch_step(
    policy: &Policy,
    optimizer: &mut AdamW,
    vars: &[Var],
    config: &PpoConfig,
    rollout: &Rollout,
    advantages: &[f32],
    returns: &[f32],
    batch: &[usize],
    rows: usize,
    columns: usize,
) -> candle_core::Result<Losses> {
    let device = &policy.device;
    let width = rows * columns;
    let actions_n = KINDS * rows;
    let b = batch.len();
    let mut obs = Vec::with_capacity(b * width);
    let mut legal = Vec::with_capacity(b * actions_n);
    for &i in batch {
        obs.extend_from_slice(&rollout.obs[i * width..(i + 1) * width]);
        legal.extend_from_slice(&rollout.legal[i * actions_n..(i + 1) * actions_n]);
    }
    let mut adv: Vec<f32> = batch.iter().map(|&i| advantages[i]).collect();
    if config.normalize_advantages && b > 1 {
        let mean = adv.iter().sum::<f32>() / b as f32;
        // Unbiased std, as torch's `std()` in CleanRL.
        let var = adv.iter().map(|a| (a - mean).powi(2)).sum::<f32>() / (b - 1) as f32;
        let std = var.sqrt();
        for a in &mut adv {
            *a = (*a - mean) / (std + 1e-8);
        }
    }
    let obs = Tensor::from_vec(obs, (b, rows, columns), device)?;
    let bias = mask_bias(&legal, b, actions_n, device)?;
    let actions = Tensor::from_vec(
        batch
            .iter()
            .map(|&i| rollout.actions[i])
            .collect::<Vec<u32>>(),
        (b, 1),
        device,
    )?;
    let old_log_probs = Tensor::from_vec(
        batch
            .iter()
            .map(|&i| rollout.log_probs[i])
            .collect::<Vec<f32>>(),
        b,
        device,
    )?;
    let adv = Tensor::from_vec(adv, b, device)?;
    let ret = Tensor::from_vec(
        batch.iter().map(|&i| returns[i]).collect::<Vec<f32>>(),
        b,
        device,
    )?;

    let (logits, values) = policy.forward(&obs)?;
    let log_probs = masked_log_softmax(&logits, &bias)?;
    let new_log_probs = log_probs.gather(&actions, 1)?.squeeze(1)?;
    let ratio = (new_log_probs - old_log_probs)?.exp()?;
    let clip = f64::from(config.clip);
    let surrogate = (ratio.neg()? * &adv)?;
    let clipped = (ratio.clamp(1.0 - clip, 1.0 + clip)?.neg()? * &adv)?;
    let policy_loss = surrogate.maximum(&clipped)?.mean_all()?;
    let value_loss = ((values - ret)?.sqr()?.mean_all()? * 0.5)?;
    // Illegal entries contribute 0 · MASKED_LOGIT = 0: the entropy of the masked policy.
    let entropy = (log_probs.exp()? * &log_probs)?.sum(1)?.mean_all()?.neg()?;
    let loss = ((&policy_loss - (&entropy * f64::from(config.entropy_coef))?)?
        + (&value_loss * f64::from(config.value_coef))?)?;

    let mut grads = loss.backward()?;
    clip_grad_norm(&mut grads, vars, config.max_grad_norm)?;
    optimizer.step(&grads)?;
    Ok(Losses {
        policy: policy_loss.to_scalar()?,
        value: value_loss.to_scalar()?,
        entropy: entropy.to_scalar()?,
    })
}

/// Trains a fresh network (seeded by `config.seed`) on `game` for at most `max_steps`
/// environment steps.
pub fn train(
    game: &mut impl Game,
    config: &PpoConfig,
    max_steps: usize,
) -> Result<PpoReport, SassError> {
    let mut policy = Policy::new(
        game.columns(),
        config.hidden,
        config.conv_layers,
        config.seed,
    )?;
    train_policy(&mut policy, game, config, max_steps)
}

/// Trains `policy` on `game`: rollouts of `steps_per_update` steps, each followed by
/// `epochs` passes of clipped-surrogate PPO over shuffled minibatches. Stops after
/// `max_steps` environment steps, when the game's measurement budget is spent, or
/// when not even a fresh episode has a legal move.
pub fn train_policy(
    policy: &mut Policy,
    game: &mut impl Game,
    config: &PpoConfig,
    max_steps: usize,
) -> Result<PpoReport, SassError> {
    let rows = game.rows();
    let columns = game.columns();
    if columns != policy.columns {
        return Err(SassError::Input(format!(
            "ppo: game has {columns} columns, the network reads {}",
            policy.columns
        )));
    }
    if config.steps_per_update == 0 || config.minibatch_size == 0 || config.episode_length == 0 {
        return Err(SassError::Input(
            "ppo: steps_per_update, minibatch_size and episode_length must be positive".into(),
        ));
    }
    let vars = policy.vars();
    // CleanRL's Adam: eps 1e-5, no weight decay.
    let mut optimizer = AdamW::new(
        vars.clone(),
        ParamsAdamW {
            lr: config.learning_rate,
            eps: 1e-5,
            weight_decay: 0.0,
            ..ParamsAdamW::default()
        },
    )
    .map_err(tool)?;
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed ^ SAMPLING_STREAM);
    let total_updates = max_steps.div_ceil(config.steps_per_update).max(1);

    let mut report = PpoReport::default();
    let mut episode_return = 0.0f32;
    let mut episode_steps = 0usize;
    game.reset();
    loop {
        let frac = 1.0 - report.updates as f64 / total_updates as f64;
        optimizer.set_learning_rate(config.learning_rate * frac.max(0.0));

        let mut rollout = Rollout::default();
        let mut stop = false;
        while rollout.len() < config.steps_per_update {
            if report.steps >= max_steps || game.exhausted() {
                stop = true;
                break;
            }
            let mut legal = game.legal();
            if !legal.iter().any(|&l| l) {
                // A dead end ends the episode; start over from the initial order.
                if episode_steps > 0 {
                    if let Some(done) = rollout.dones.last_mut() {
                        *done = true;
                    }
                    report.episodes += 1;
                    report.episode_returns.push(episode_return);
                    episode_return = 0.0;
                    episode_steps = 0;
                }
                game.reset();
                legal = game.legal();
                if !legal.iter().any(|&l| l) {
                    stop = true;
                    break;
                }
            }
            let obs = game.observation();
            let (action, log_prob, value) = policy.act(&obs, rows, columns, &legal, &mut rng)?;
            let step = game.step(action)?;
            report.steps += 1;
            episode_return += step.reward;
            episode_steps += 1;
            let done = step.done || episode_steps >= config.episode_length;

            rollout.obs.extend_from_slice(&obs);
            rollout.legal.extend_from_slice(&legal);
            rollout.actions.push(action.index() as u32);
            rollout.log_probs.push(log_prob);
            rollout.values.push(value);
            rollout.rewards.push(step.reward);
            rollout.dones.push(done);

            if done {
                report.episodes += 1;
                report.episode_returns.push(episode_return);
                episode_return = 0.0;
                episode_steps = 0;
                game.reset();
            }
        }
        if rollout.len() == 0 {
            break;
        }

        // Bootstrap from the state after the rollout unless it is terminal (the
        // episode just ended, or no move is left in it).
        let last_done = rollout.dones.last().copied().unwrap_or(true);
        let next_value = if last_done {
            0.0
        } else {
            let legal = game.legal();
            if legal.iter().any(|&l| l) {
                policy
                    .evaluate(&game.observation(), rows, columns, &legal)?
                    .1
            } else {
                0.0
            }
        };
        let (advantages, returns) = gae(
            &rollout.rewards,
            &rollout.values,
            &rollout.dones,
            next_value,
            config.gamma,
            config.gae_lambda,
        );

        let mut indices: Vec<usize> = (0..rollout.len()).collect();
        let (mut policy_sum, mut value_sum, mut entropy_sum, mut batches) = (0.0, 0.0, 0.0, 0);
        for _ in 0..config.epochs {
            // Fisher–Yates with the run's generator, so the minibatches are seeded too.
            for i in (1..indices.len()).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                indices.swap(i, j);
            }
            for batch in indices.chunks(config.minibatch_size) {
                let losses = minibatch_step(
                    policy,
                    &mut optimizer,
                    &vars,
                    config,
                    &rollout,
                    &advantages,
                    &returns,
                    batch,
                    rows,
                    columns,
                )
                .map_err(tool)?;
                policy_sum += losses.policy;
                value_sum += losses.value;
                entropy_sum += losses.entropy;
                batches += 1;
            }
        }
        report.updates += 1;
        let batches = batches.max(1) as f32;
        report.policy_loss.push(policy_sum / batches);
        report.value_loss.push(value_sum / batches);
        report.entropy.push(entropy_sum / batches);
        if stop {
            break;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::game::Step;
    use crate::legality::moves::Kind;

    /// A permutation game: row `i` shows the features of the item at position `i`.
    /// Item 0 is marked (column 0 = 1); moving it up earns +1, every other move −0.05.
    /// Optionally records every action taken.
    struct Toy {
        items: usize,
        columns: usize,
        start: usize,
        order: Vec<usize>,
        moves: usize,
        episode: usize,
        budget: Option<usize>,
        taken: Vec<usize>,
    }

    impl Toy {
        fn new(items: usize, columns: usize, start: usize, episode: usize) -> Toy {
            let mut toy = Toy {
                items,
                columns,
                start,
                order: Vec::new(),
                moves: 0,
                episode,
                budget: None,
                taken: Vec::new(),
            };
            toy.reset();
            toy
        }

        fn target_row(&self) -> usize {
            self.order.iter().position(|&item| item == 0).unwrap()
        }
    }

    impl Game for Toy {
        fn rows(&self) -> usize {
            self.items
        }
        fn columns(&self) -> usize {
            self.columns
        }
        fn observation(&self) -> Vec<f32> {
            let mut obs = vec![0.0; self.items * self.columns];
            for (row, &item) in self.order.iter().enumerate() {
                let cells = &mut obs[row * self.columns..(row + 1) * self.columns];
                cells[0] = f32::from(item == 0);
                // Distractor features: bits of the item id.
                for (c, cell) in cells.iter_mut().enumerate().skip(1) {
                    *cell = f32::from(u8::from((item >> (c - 1)) & 1 == 1));
                }
            }
            obs
        }
        fn legal(&self) -> Vec<bool> {
            (0..KINDS * self.items)
                .map(|i| {
                    let a = Action::from_index(i);
                    match a.kind {
                        Kind::Up => a.row > 0,
                        Kind::Down => a.row + 1 < self.items,
                        _ => false,
                    }
                })
                .collect()
        }
        fn step(&mut self, action: Action) -> Result<Step, SassError> {
            assert!(self.legal()[action.index()], "illegal action sampled");
            self.taken.push(action.index());
            let other = match action.kind {
                Kind::Up => action.row - 1,
                _ => action.row + 1,
            };
            let rewarded = self.order[action.row] == 0 && action.kind == Kind::Up;
            self.order.swap(action.row, other);
            self.moves += 1;
            if let Some(b) = &mut self.budget {
                *b = b.saturating_sub(1);
            }
            Ok(Step {
                reward: if rewarded { 1.0 } else { -0.05 },
                done: self.moves >= self.episode,
            })
        }
        fn reset(&mut self) {
            self.order = (0..self.items).collect();
            // Put the marked item at `start`.
            self.order.swap(0, self.start);
            self.moves = 0;
        }
        fn exhausted(&self) -> bool {
            self.budget == Some(0)
        }
    }

    #[test]
    fn masked_probabilities_are_exact() {
        let policy = Policy::new(6, 16, 2, 3).unwrap();
        let toy = Toy::new(10, 6, 4, 8);
        let obs = toy.observation();
        let mut legal = toy.legal();
        for i in [3, 7, 8, 15] {
            legal[i] = false;
        }
        let probs = policy.distribution(&obs, 10, 6, &legal).unwrap();
        assert_eq!(probs.len(), KINDS * 10);
        let mut sum = 0.0f64;
        for (p, ok) in probs.iter().zip(&legal) {
            if *ok {
                assert!(*p > 0.0);
                sum += f64::from(*p);
            } else {
                assert_eq!(*p, 0.0);
            }
        }
        assert!((sum - 1.0).abs() < 1e-5, "legal probabilities sum to {sum}");

        // With one legal action it is certain and always chosen.
        let mut only = vec![false; KINDS * 10];
        only[13] = true;
        let probs = policy.distribution(&obs, 10, 6, &only).unwrap();
        assert_eq!(probs[13], 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let (action, log_prob, _) = policy.act(&obs, 10, 6, &only, &mut rng).unwrap();
            assert_eq!(action.index(), 13);
            assert_eq!(log_prob, 0.0);
        }
        // Sampling never returns an illegal action, even with u at the top of [0, 1).
        let lp: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        assert_eq!(sample(&lp, &only, 0.999_999_999), 13);
        // No legal action is an input error, not a panic.
        assert!(policy.act(&obs, 10, 6, &[false; 20], &mut rng).is_err());
    }

    #[test]
    fn shapes_and_one_update_for_two_row_counts() {
        let config = PpoConfig {
            hidden: 16,
            ..PpoConfig::default()
        };
        let mut policy = Policy::new(5, config.hidden, config.conv_layers, 11).unwrap();
        for rows in [7, 19] {
            let toy = Toy::new(rows, 5, rows / 2, 8);
            let obs: Vec<f32> = [toy.observation(), toy.observation(), toy.observation()].concat();
            let x = Tensor::from_vec(obs, (3, rows, 5), &Device::Cpu).unwrap();
            let (logits, values) = policy.forward(&x).unwrap();
            assert_eq!(logits.dims(), &[3, KINDS * rows]);
            assert_eq!(values.dims(), &[3]);

            let mut game = Toy::new(rows, 5, rows / 2, 8);
            let before = policy
                .distribution(&game.observation(), rows, 5, &game.legal())
                .unwrap();
            let report = train_policy(&mut policy, &mut game, &config, 64).unwrap();
            assert_eq!(report.steps, 64);
            assert_eq!(report.updates, 1);
            assert_eq!(report.episodes, 8);
            assert_eq!(report.episode_returns.len(), 8);
            assert_eq!(report.policy_loss.len(), 1);
            assert!(report.policy_loss[0].is_finite());
            assert!(report.value_loss[0].is_finite());
            assert!(report.entropy[0] > 0.0);
            game.reset();
            let after = policy
                .distribution(&game.observation(), rows, 5, &game.legal())
                .unwrap();
            assert_ne!(before, after, "the update changed nothing");
        }
    }

    #[test]
    fn stops_on_budget_and_dead_ends() {
        let config = PpoConfig {
            hidden: 8,
            ..PpoConfig::default()
        };
        let mut game = Toy::new(6, 4, 3, 8);
        game.budget = Some(20);
        let report = train(&mut game, &config, 1000).unwrap();
        assert_eq!(report.steps, 20);
        assert_eq!(report.updates, 1);

        // One row: no move is ever legal, so training stops at once.
        let mut game = Toy::new(1, 4, 0, 8);
        let report = train(&mut game, &config, 1000).unwrap();
        assert_eq!(report.steps, 0);
        assert_eq!(report.updates, 0);
    }

    #[test]
    fn gae_matches_hand_computation() {
        let (adv, ret) = gae(
            &[1.0, 0.0, 2.0],
            &[0.5, 0.25, 1.0],
            &[false, true, false],
            3.0,
            0.5,
            0.5,
        );
        // t=2: δ = 2 + 0.5·3 − 1 = 2.5; A = 2.5.
        // t=1: terminal: δ = 0 − 0.25 = −0.25; A = −0.25.
        // t=0: δ = 1 + 0.5·0.25 − 0.5 = 0.625; A = 0.625 + 0.25·(−0.25) = 0.5625.
        let expect = [0.5625, -0.25, 2.5];
        for (a, e) in adv.iter().zip(expect) {
            assert!((a - e).abs() < 1e-6, "{adv:?}");
        }
        assert!((ret[0] - 1.0625).abs() < 1e-6 && (ret[2] - 3.5).abs() < 1e-6);
    }

    #[test]
    fn same_seed_same_actions() {
        let run = |seed: u64| {
            let config = PpoConfig {
                hidden: 8,
                seed,
                ..PpoConfig::default()
            };
            let mut game = Toy::new(8, 4, 5, 8);
            let report = train(&mut game, &config, 200).unwrap();
            (game.taken, report)
        };
        let (a, report_a) = run(42);
        let (b, report_b) = run(42);
        assert_eq!(a.len(), 200);
        assert_eq!(a, b);
        assert_eq!(report_a, report_b);
        let (c, _) = run(43);
        assert_ne!(a, c);
    }

    #[test]
    fn learns_to_move_the_marked_row_up() {
        let start = std::time::Instant::now();
        // A larger step than CuAsmRL's 2.5e-4, which needs far more steps than a unit
        // test can take; the mechanism under test is the same.
        let config = PpoConfig {
            episode_length: 8,
            learning_rate: 3e-3,
            seed: 5,
            ..PpoConfig::default()
        };
        let mut game = Toy::new(12, 6, 6, 8);
        let mut policy = Policy::new(6, config.hidden, config.conv_layers, config.seed).unwrap();
        let rewarded = Action {
            row: game.target_row(),
            kind: Kind::Up,
        }
        .index();
        let initial = policy
            .distribution(&game.observation(), 12, 6, &game.legal())
            .unwrap()[rewarded];
        let report = train_policy(&mut policy, &mut game, &config, 3000).unwrap();
        game.reset();
        let trained = policy
            .distribution(&game.observation(), 12, 6, &game.legal())
            .unwrap()[rewarded];
        let first: f32 = report.episode_returns[..20].iter().sum::<f32>() / 20.0;
        let n = report.episode_returns.len();
        let last: f32 = report.episode_returns[n - 20..].iter().sum::<f32>() / 20.0;
        eprintln!(
            "p(rewarded) {initial:.3} → {trained:.3}; mean return {first:.2} → {last:.2}; \
             {} updates in {:.1?}",
            report.updates,
            start.elapsed()
        );
        assert!(initial < 0.1, "initial policy not near uniform: {initial}");
        assert!(
            trained > 0.4 && trained > 4.0 * initial,
            "{initial} → {trained}"
        );
        assert!(last > first + 1.0, "returns {first} → {last}");
    }
}
