//! Second stage: SASS instruction reordering of the best kernel's cubin.
//!
//! Empty until the SASS issue: cubin decoding, dependency analysis, legal moves, rewrite, validation and the RL agent.
