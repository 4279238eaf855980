//! What a reordering may do: the dependency graph, pinned instructions and basic
//! blocks of a kernel (`analysis`), the latencies fixed-latency results need
//! (`latency`), the moves (`moves`), and orders with their verifier and the words they
//! write (`order`). Every candidate the agents propose passes these rules before the
//! GPU sees it; the GPU's bit-exact check then backs them up.

pub mod analysis;
pub mod latency;
pub mod moves;
pub mod order;
