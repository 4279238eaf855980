//! How a kernel is launched: its grid (up to three dimensions), its block, its thread
//! block cluster, its dynamic shared memory, the instruction set it is compiled for,
//! and what it takes besides its buffers (scratch, tensor maps).
//!
//! The launch travels with a kernel through measurement workers, deploy caches and
//! exported sidecars as JSON, so its serialized form is kept stable: a one-dimensional
//! grid is written as a plain number, as it always was, and a cluster of one block and
//! the base instruction set are left out. Older files therefore read unchanged, and a
//! kernel that uses none of the Hopper-only parts writes exactly what it wrote before.

use crate::atom::tma::TensorBox;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// Three extents (x, y, z), each at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Dim3 {
    /// One element: a grid of one block, or no cluster.
    pub const ONE: Dim3 = Dim3 { x: 1, y: 1, z: 1 };

    /// `x` along the first dimension alone.
    pub const fn linear(x: u32) -> Dim3 {
        Dim3 { x, y: 1, z: 1 }
    }

    /// Whether only the first dimension is used.
    pub fn is_linear(&self) -> bool {
        self.y == 1 && self.z == 1
    }

    pub fn is_one(&self) -> bool {
        *self == Dim3::ONE
    }

    /// `x · y · z`.
    pub fn count(&self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }

    pub fn as_array(&self) -> [u32; 3] {
        [self.x, self.y, self.z]
    }
}

impl From<u32> for Dim3 {
    fn from(x: u32) -> Dim3 {
        Dim3::linear(x)
    }
}

/// The number of elements: a grid's blocks.
impl From<Dim3> for u64 {
    fn from(d: Dim3) -> u64 {
        d.count()
    }
}

/// `64` for a linear extent, `(64, 2, 1)` otherwise.
impl fmt::Display for Dim3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_linear() {
            write!(f, "{}", self.x)
        } else {
            write!(f, "({}, {}, {})", self.x, self.y, self.z)
        }
    }
}

impl Serialize for Dim3 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_linear() {
            s.serialize_u32(self.x)
        } else {
            self.as_array().serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Dim3 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Dim3, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Linear(u32),
            Full([u32; 3]),
        }
        let [x, y, z] = match Form::deserialize(d)? {
            Form::Linear(x) => [x, 1, 1],
            Form::Full(a) => a,
        };
        if x == 0 || y == 0 || z == 0 {
            return Err(serde::de::Error::custom(format!(
                "extent ({x}, {y}, {z}) has a zero dimension"
            )));
        }
        Ok(Dim3 { x, y, z })
    }
}

/// The instruction set a kernel is compiled for, relative to the GPU's architecture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// The architecture itself (`sm_90`): what the CUDA-core and `mma.sync` sketches use.
    #[default]
    Base,
    /// Its architecture-specific variant (`sm_90a`), which adds Hopper's warpgroup MMA
    /// and register reallocation; such a cubin runs on that architecture only.
    ArchSpecific,
}

impl Target {
    fn is_base(&self) -> bool {
        *self == Target::Base
    }

    /// The GPU's own architecture of an architecture compiled for (`sm_90a` → `sm_90`):
    /// the inverse of [`Target::arch`].
    pub fn base_arch(arch: &str) -> &str {
        arch.strip_suffix('a').unwrap_or(arch)
    }

    /// The architecture to compile for on a GPU of architecture `base` (`sm_90`).
    pub fn arch(self, base: &str) -> String {
        match self {
            Target::Base => base.to_string(),
            Target::ArchSpecific => format!("{base}a"),
        }
    }
}

/// A kernel parameter after the buffers: the TMA tensor map of one of them, which the
/// launcher encodes (`cuTensorMapEncodeTiled`) from `tensor` and that buffer's address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorMapArg {
    /// Index of the buffer among the kernel's buffer parameters (inputs first).
    pub buffer: usize,
    pub tensor: TensorBox,
}

/// Grid, block, cluster and dynamic shared memory of a kernel launch, its target, the
/// scratch it takes after its buffers and the tensor maps after that.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchConfig {
    /// Blocks; the IR's block index is their linear index (x fastest).
    pub grid: Dim3,
    /// Threads per block (one dimension).
    pub block: u32,
    /// Blocks per thread block cluster; each grid dimension is a multiple of its own.
    #[serde(default = "one", skip_serializing_if = "Dim3::is_one")]
    pub cluster: Dim3,
    pub dynamic_shared_bytes: u32,
    /// The output buffer must be zeroed before every launch: the kernel adds into it
    /// (split-K). The zeroing is part of the operation, so it is timed with the kernel.
    #[serde(default)]
    pub zero_output: bool,
    #[serde(default, skip_serializing_if = "Target::is_base")]
    pub target: Target,
    /// Tensor-map parameters, in order after the buffers (the `wgmma` sketch's TMA
    /// copies). Left out of the JSON when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_maps: Vec<TensorMapArg>,
    /// Bytes of device scratch the kernel takes as its parameter after the buffers
    /// (split-K's semaphores and partial sums, see `lower::wgmma`); 0 for none, and
    /// then left out of the JSON. It must be zeroed before the kernel's first launch
    /// and belong to this kernel alone (another's partial sums may lie where this one
    /// keeps its semaphores), not shared by launches that may run at the same time;
    /// every launch leaves its semaphores zeroed, so it is zeroed once, not per launch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub workspace_bytes: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

fn one() -> Dim3 {
    Dim3::ONE
}

impl LaunchConfig {
    /// A one-dimensional grid of `grid` blocks of `block` threads, without a cluster,
    /// for the base architecture, its output not zeroed.
    pub fn linear(grid: u32, block: u32, dynamic_shared_bytes: u32) -> LaunchConfig {
        LaunchConfig {
            grid: Dim3::linear(grid),
            block,
            cluster: Dim3::ONE,
            dynamic_shared_bytes,
            zero_output: false,
            target: Target::Base,
            tensor_maps: Vec::new(),
            workspace_bytes: 0,
        }
    }

    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        self.grid.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linear_launch_serializes_as_it_always_did() {
        let mut l = LaunchConfig::linear(392, 128, 4096);
        l.zero_output = true;
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(
            json,
            r#"{"grid":392,"block":128,"dynamic_shared_bytes":4096,"zero_output":true}"#
        );
        let old = r#"{"grid":392,"block":128,"dynamic_shared_bytes":4096}"#;
        let read: LaunchConfig = serde_json::from_str(old).unwrap();
        assert_eq!(read, LaunchConfig::linear(392, 128, 4096));
    }

    #[test]
    fn grids_clusters_and_targets_round_trip() {
        let l = LaunchConfig {
            grid: Dim3 { x: 4, y: 3, z: 2 },
            cluster: Dim3 { x: 2, y: 1, z: 1 },
            target: Target::ArchSpecific,
            ..LaunchConfig::linear(1, 384, 0)
        };
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(
            json,
            r#"{"grid":[4,3,2],"block":384,"cluster":2,"dynamic_shared_bytes":0,"zero_output":false,"target":"arch_specific"}"#
        );
        assert_eq!(serde_json::from_str::<LaunchConfig>(&json).unwrap(), l);
        assert_eq!(l.blocks(), 24);
        assert_eq!(l.grid.to_string(), "(4, 3, 2)");
        assert_eq!(l.target.arch("sm_90"), "sm_90a");
        assert_eq!(Target::Base.arch("sm_90"), "sm_90");
        assert_eq!(Target::base_arch("sm_90a"), "sm_90");
        assert_eq!(Target::base_arch("sm_90"), "sm_90");
    }

    #[test]
    fn a_zero_extent_is_refused() {
        let e = serde_json::from_str::<Dim3>("[4,0,1]").unwrap_err();
        assert!(e.to_string().contains("zero dimension"), "{e}");
        assert!(serde_json::from_str::<Dim3>("0").is_err());
    }
}
