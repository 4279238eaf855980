//! What a reordering may do: the dependency graph, pinned instructions and basic
//! blocks of a kernel (`analysis`), the latencies fixed-latency results need
//! (`latency`), the actions (`moves`), orders with their verifier and the words they
//! write (`order`), and the rules of control-bit edits (`control`); `profile` says where
//! the hot loop's issue cycles go. Every candidate the agents propose passes these
//! rules before the GPU sees it; the GPU's bit-exact check then backs them up.

pub mod analysis;
pub mod control;
pub mod latency;
pub mod moves;
pub mod order;
pub mod profile;
#[cfg(test)]
pub(crate) mod testkit;
