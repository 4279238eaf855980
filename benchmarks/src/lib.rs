//! Side-by-side benchmarks against cuDNN and cuBLAS, with tables and plots.
//!
//! Empty until the benchmark issue: runs the best tuned kernels and the vendor baselines in one process.
