//! What the gpu crate's GPU tests share: a context and the device's attributes on GPU
//! 0, failing plainly where there is no driver.

use gpu::DeviceInfo;
use gpu::cuda::{self, Context};

/// A context on GPU 0 and its device.
pub fn gpu() -> (Context, DeviceInfo) {
    assert!(cuda::driver_present(), "no CUDA driver on this machine");
    let ctx = Context::new(0).expect("a context on GPU 0");
    let device = DeviceInfo::query(&ctx).expect("device attributes");
    (ctx, device)
}
