//! Building and measuring candidates, shared by the tuner (`search`) and the queue's
//! workers (`queue`), so that a GPU worker host builds neither the search nor the cost
//! model: the `Measurer` interface and its local implementation (`measurer`), building
//! a state's kernel with NVRTC through the cubin cache (`build`), and the developer's
//! fault injection that proves the measurement isolation (`inject`).

pub mod build;
pub mod inject;
pub mod measurer;

pub use measurer::{Job, Local, LocalError, MeasureError, Measured, Measurer};
