//! Search strategies, task scheduler, measurement orchestration and tuning records.
//!
//! Empty until the measurement issue: random, evolutionary and DGD search over `schedule` states, measured through `gpu`.
