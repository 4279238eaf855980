//! Side-by-side benchmarks of the tuner's best kernels against the vendor libraries a
//! user would otherwise call (cuDNN for convolutions, cuBLAS and cuBLASLt for matmul),
//! at the task's precision (float32, TF32, fp16, bf16), timed with the tuner's own
//! protocol in one process on one GPU, with the roofline of each task from peaks
//! measured in the same run; the report (JSON, Markdown) and plots (PNG).
//!
//! The vendor wrappers live here rather than in `gpu` because they exist only to be
//! compared with: nothing the tuner emits depends on cuDNN or cuBLAS.

/// Declares a table of C functions resolved from a loaded vendor library (see
/// `vendor::Loaded::function`): each field is named after its C function, whose exact
/// signature it states.
macro_rules! functions {
    ($(#[$meta:meta])* struct $name:ident in $file:expr;
     $( fn $f:ident ( $($arg:ty),* $(,)? ) -> $ret:ty; )*) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        struct $name {
            $( $f: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl $name {
            fn resolve(
                loaded: &crate::vendor::Loaded,
            ) -> Result<$name, crate::vendor::VendorError> {
                Ok($name {
                    // SAFETY: each field's type is the C signature, from the vendor's
                    // header, of the function it is named after.
                    $( $f: unsafe { loaded.function($file, stringify!($f))? }, )*
                })
            }
        }
    };
}

pub mod baseline;
pub mod cublas;
pub mod cudnn;
pub mod cudnn_graph;
pub mod curves;
pub mod host;
pub mod peaks;
pub mod plot;
pub mod report;
pub mod run;
pub mod vendor;
