//! Cost models that rank schedules: XGBoost on analytical features, and a random model.
//!
//! Empty until the search issue: it will hold the `CostModel` trait and its implementations, fed by `features`.
