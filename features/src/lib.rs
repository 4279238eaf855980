//! Analytical features of a schedule for a given GPU.
//!
//! Empty until the search issue: it will compute named features (memory transactions, bank conflicts, occupancy, wave efficiency, ILP/WLP) from `schedule`'s states and `GpuSpec`.
