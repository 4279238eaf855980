//! Side-by-side benchmarks of the tuner's best kernels against the vendor libraries a
//! user would otherwise call (cuDNN for convolutions, cuBLAS for matmul), timed with the
//! tuner's own protocol in one process on one GPU, with the roofline of each task from
//! peaks measured in the same run; the report (JSON, Markdown) and plots (PNG).
//!
//! The vendor wrappers live here rather than in `gpu` because they exist only to be
//! compared with: nothing the tuner emits depends on cuDNN or cuBLAS.

pub mod cublas;
pub mod cudnn;
pub mod curves;
pub mod peaks;
pub mod plot;
pub mod report;
pub mod run;
pub mod vendor;
