//! Which sketch a state belongs to, with that sketch's tiling: one value, so that a state
//! is one sketch, never two. Each sketch's tiling type is its folder's (`tiling.rs`);
//! this enum is where a new sketch registers its variant.

use crate::sketch::mma_sync::tiling::MmaTiling;
use crate::sketch::wgmma::tiling::WgmmaTiling;
use serde::{Deserialize, Serialize};

/// Which sketch a state belongs to, with its tiling: one sketch, never two.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum SketchTiling {
    /// Ansor's `SSSRRSRS` tiling, in the state's own fields.
    #[default]
    CudaCore,
    MmaSync(MmaTiling),
    Wgmma(WgmmaTiling),
    #[cfg(test)]
    OneThread(crate::sketch::one_thread::OneThread),
}

/// Written as the fields states had before sketches were one value: `"mma"` or
/// `"wgmma"`, or nothing for the CUDA-core sketch, so that every state keeps its JSON,
/// hence its id.
impl Serialize for SketchTiling {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        match self {
            SketchTiling::CudaCore => {}
            SketchTiling::MmaSync(t) => map.serialize_entry("mma", t)?,
            SketchTiling::Wgmma(t) => map.serialize_entry("wgmma", t)?,
            #[cfg(test)]
            SketchTiling::OneThread(t) => map.serialize_entry("one_thread", &t.0)?,
        }
        map.end()
    }
}

/// Read from those fields; a state with both is refused.
impl<'de> Deserialize<'de> for SketchTiling {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Sketches {
            #[serde(default)]
            mma: Option<MmaTiling>,
            #[serde(default)]
            wgmma: Option<WgmmaTiling>,
        }
        let Sketches { mma, wgmma } = Sketches::deserialize(deserializer)?;
        match (mma, wgmma) {
            (None, None) => Ok(SketchTiling::CudaCore),
            (Some(t), None) => Ok(SketchTiling::MmaSync(t)),
            (None, Some(t)) => Ok(SketchTiling::Wgmma(t)),
            (Some(_), Some(_)) => Err(serde::de::Error::custom(
                "a state of two sketches (both \"mma\" and \"wgmma\")",
            )),
        }
    }
}
