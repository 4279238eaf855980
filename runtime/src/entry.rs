//! The checks a deploy entry passes before its kernel is launched. A kernel given the
//! wrong parameters does not fail: it reads and writes wherever they point. So
//! everything a launch takes from an entry must agree with the kernel:
//!
//! - its task: valid (the checks of `Task::new`; an edited shape could otherwise panic
//!   where its sizes are derived), written as tilesched writes it, named by the entry's
//!   key;
//! - its kernel's parameters as the cubin records them (`gpu::cubin::kernel_params`): a
//!   pointer per buffer `params_of` names, then a 128-byte tensor map per map the entry
//!   records, and nothing else;
//! - each tensor map: of one of the task's buffers (not the workspace), in its element
//!   type, reaching no further than its bytes, and within TMA's rules.
//!
//! `DeployCache::load` runs them on every entry and `store` on every new one, so an
//! edited or damaged index is refused when the cache opens, naming the entry; the
//! runtime runs them again on the cubin it loads.

use crate::{DeployEntry, Param, Role};
use gpu::Task;
use gpu::cubin::{CubinError, kernel_params};
use thiserror::Error;

/// Bytes of a pointer parameter.
const POINTER_BYTES: u32 = 8;
/// Bytes of a tensor map parameter (`CUtensorMap`).
const TENSOR_MAP_BYTES: u32 = 128;

/// Why an entry's kernel cannot be launched as the entry says.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EntryError {
    #[error("it has no task shape (written by an older tilesched); store the kernel again")]
    NoShape,
    #[error("its shape is not a valid task ({0})")]
    InvalidShape(String),
    #[error("its shape is not written as tilesched writes {0}")]
    NotCanonical(String),
    #[error("its shape is task {shape}, not {key}")]
    OtherTask { shape: String, key: String },
    #[error("its cubin {path} is unreadable: {error}")]
    CubinUnreadable { path: String, error: String },
    #[error(
        "its cubin {path} does not match its recorded sha256 (expected {expected}, found {found}): the file was modified; store the kernel again"
    )]
    CubinAltered {
        path: String,
        expected: String,
        found: String,
    },
    #[error("the parameters of its kernel {kernel} cannot be read from its cubin: {error}")]
    Unreadable { kernel: String, error: CubinError },
    #[error(
        "its kernel {kernel} takes {takes} parameters, but the entry gives {pointers} pointers and {maps} tensor maps"
    )]
    ParamCount {
        kernel: String,
        takes: usize,
        pointers: usize,
        maps: usize,
    },
    #[error(
        "parameter {index} of its kernel {kernel} is {bytes} bytes, where a {what} is {expected}"
    )]
    ParamSize {
        kernel: String,
        index: usize,
        bytes: u32,
        what: &'static str,
        expected: u32,
    },
    #[error("its tensor map {map} is of buffer {buffer}, but the kernel takes {buffers} buffers")]
    MapBuffer {
        map: usize,
        buffer: usize,
        buffers: usize,
    },
    #[error("its tensor map {map} reads {dtype} elements from buffer {buffer} ({param})")]
    MapType {
        map: usize,
        dtype: gpu::DType,
        buffer: usize,
        param: Param,
    },
    #[error(
        "its tensor map {map} reaches {bytes} bytes into buffer {buffer} ({param}), which holds {holds}"
    )]
    MapExtent {
        map: usize,
        bytes: u128,
        buffer: usize,
        param: Param,
        holds: usize,
    },
    #[error("its tensor map {map} breaks a rule of TMA ({why})")]
    MapRule { map: usize, why: String },
}

/// The entry's task, checked: present, valid, in tilesched's form, named by the key.
pub(crate) fn task_of(e: &DeployEntry) -> Result<&Task, EntryError> {
    let t = e.shape.as_ref().ok_or(EntryError::NoShape)?;
    // Built again through the constructors' checks: serde builds a task without them.
    let task = Task::new(t.op, t.epilogue)
        .and_then(|c| c.with_types(t.dtype, t.out_dtype, t.layout))
        .map_err(|err| EntryError::InvalidShape(err.to_string()))?;
    if task != *t {
        return Err(EntryError::NotCanonical(task.key()));
    }
    if task.key() != e.task {
        return Err(EntryError::OtherTask {
            shape: task.key(),
            key: e.task.clone(),
        });
    }
    Ok(t)
}

/// Every check of the module on an entry and its cubin's bytes: its task (through
/// `params_of`), its kernel's parameters, its tensor maps.
pub(crate) fn check(e: &DeployEntry, cubin: &[u8]) -> Result<(), EntryError> {
    let params = crate::params_of(e)?;
    let maps = &e.launch.tensor_maps;
    let takes = kernel_params(cubin, &e.kernel).map_err(|error| EntryError::Unreadable {
        kernel: e.kernel.clone(),
        error,
    })?;
    if takes.len() != params.len() + maps.len() {
        return Err(EntryError::ParamCount {
            kernel: e.kernel.clone(),
            takes: takes.len(),
            pointers: params.len(),
            maps: maps.len(),
        });
    }
    for (index, p) in takes.iter().enumerate() {
        let (what, expected) = if index < params.len() {
            ("pointer", POINTER_BYTES)
        } else {
            ("tensor map", TENSOR_MAP_BYTES)
        };
        if p.size != expected {
            return Err(EntryError::ParamSize {
                kernel: e.kernel.clone(),
                index,
                bytes: p.size,
                what,
                expected,
            });
        }
    }
    // The maps are of the task's buffers (inputs, bias, output), never the workspace.
    let buffers: Vec<&Param> = params
        .iter()
        .filter(|p| p.role != Role::Workspace)
        .collect();
    for (i, map) in maps.iter().enumerate() {
        let Some(&&param) = buffers.get(map.buffer) else {
            return Err(EntryError::MapBuffer {
                map: i,
                buffer: map.buffer,
                buffers: buffers.len(),
            });
        };
        let tensor = &map.tensor;
        if tensor.dtype != param.dtype {
            return Err(EntryError::MapType {
                map: i,
                dtype: tensor.dtype,
                buffer: map.buffer,
                param,
            });
        }
        tensor.check().map_err(|error| EntryError::MapRule {
            map: i,
            why: error.to_string(),
        })?;
        // One past the farthest byte: the innermost dimension is contiguous, the others
        // `strides` bytes apart (u128: extents up to 2^32 times strides up to 2^40).
        let element = u128::from(tensor.dtype.bytes());
        let outer = tensor.dims[1..].iter().zip(&tensor.strides);
        let reach = element * u128::from(tensor.dims[0])
            + outer
                .map(|(&d, &s)| u128::from(d - 1) * u128::from(s))
                .sum::<u128>();
        if reach > param.bytes() as u128 {
            return Err(EntryError::MapExtent {
                map: i,
                bytes: reach,
                buffer: map.buffer,
                param,
                holds: param.bytes(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{self, MAP, POINTER};
    use crate::{DeployCache, INDEX_FILE, NewEntry, RuntimeError, Stage, TOOL_VERSION};
    use gpu::{DType, LaunchConfig};
    use schedule::atom::tma::TensorBox;
    use schedule::atom::wgmma::Swizzle;
    use schedule::launch::{Target, TensorMapArg};
    use serde_json::Value;
    use std::path::Path;

    const H200: &str = "NVIDIA H200";
    const KERNEL: &str = "k";

    fn typed(op: &str, shape: &str, layout: schedule::Layout) -> Task {
        Task::new(
            schedule::parse_shape(op, shape).unwrap(),
            Default::default(),
        )
        .unwrap()
        .with_types(DType::Fp16, DType::Fp16, layout)
        .unwrap()
    }

    /// An fp16 GEMM whose A, B and C are 256×256.
    fn matmul() -> Task {
        typed("matmul", "256,256,256", schedule::Layout::Nchw)
    }

    /// A map of one of `matmul()`'s matrices, read in 64×64 boxes.
    fn map(buffer: usize) -> TensorMapArg {
        let tensor =
            TensorBox::matrix(DType::Fp16, 256, 256, 256, 1, 0, 64, 64, Swizzle::B128).unwrap();
        TensorMapArg { buffer, tensor }
    }

    /// A launch as the `wgmma` sketch writes one: the kernel takes A, B and C, then maps
    /// of A and B.
    fn wgmma_launch() -> LaunchConfig {
        LaunchConfig {
            target: Target::ArchSpecific,
            tensor_maps: vec![map(0), map(1)],
            ..LaunchConfig::linear(16, 384, 99328)
        }
    }

    fn new(task: &Task, launch: LaunchConfig) -> NewEntry {
        NewEntry {
            gpu: H200.to_string(),
            compute_capability: (9, 0),
            task: task.key(),
            shape: *task,
            kernel: KERNEL.to_string(),
            launch,
            stage1_us: 5.0,
            final_us: 5.0,
            stage: Stage::Stage1,
            created_by: TOOL_VERSION.to_string(),
        }
    }

    /// A cache in `dir` holding `matmul()`'s `wgmma` entry.
    fn wgmma_cache(dir: &Path) {
        let mut cache = DeployCache::open(dir).unwrap();
        let kernel = testkit::cubin(KERNEL, &[POINTER, POINTER, POINTER, MAP, MAP], 0);
        cache
            .store(new(&matmul(), wgmma_launch()), &kernel)
            .unwrap();
        DeployCache::load(dir).unwrap();
    }

    /// Opening the cache after `edit` rewrote its (first) entry fails in one line naming
    /// the entry: what is wrong with it.
    fn edited(dir: &Path, task: &Task, edit: impl FnOnce(&mut Value)) -> EntryError {
        let index = dir.join(INDEX_FILE);
        let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&index).unwrap())
            .expect("the index as stored");
        edit(&mut json["entries"][0]);
        std::fs::write(&index, serde_json::to_string_pretty(&json).unwrap()).unwrap();
        let err = DeployCache::load(dir).unwrap_err();
        let text = err.to_string();
        assert_eq!(text.lines().count(), 1, "{text}");
        let prefix = format!(
            "has a bad entry, of task {} on {H200} (sm_90): ",
            task.key()
        );
        assert!(text.contains(&prefix), "{text}");
        match err {
            RuntimeError::BadEntry { why, .. } => *why,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_wgmma_entry_without_its_tensor_maps_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        wgmma_cache(tmp.path());
        let why = edited(tmp.path(), &matmul(), |e| {
            e["launch"].as_object_mut().unwrap().remove("tensor_maps");
        });
        assert_eq!(
            why.to_string(),
            "its kernel k takes 5 parameters, but the entry gives 3 pointers and 0 tensor maps"
        );
        // Nor is it stored so.
        let mut cache = DeployCache::open(tmp.path().join("other")).unwrap();
        let kernel = testkit::cubin(KERNEL, &[POINTER, POINTER, POINTER, MAP, MAP], 0);
        let mut launch = wgmma_launch();
        launch.tensor_maps.pop();
        let err = cache.store(new(&matmul(), launch), &kernel).unwrap_err();
        assert!(
            err.to_string().contains("3 pointers and 1 tensor maps"),
            "{err}"
        );
        // As many parameters, but a map where the kernel takes a pointer (a workspace
        // the entry lost).
        let kernel = testkit::cubin(KERNEL, &[POINTER, POINTER, POINTER, POINTER, MAP], 0);
        let err = cache
            .store(new(&matmul(), wgmma_launch()), &kernel)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("parameter 3 of its kernel k is 8 bytes, where a tensor map is 128"),
            "{err}"
        );
    }

    #[test]
    fn a_tensor_map_of_a_missing_buffer_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        wgmma_cache(tmp.path());
        // The kernel takes A, B and C: buffer 3 does not exist (it was encoded at
        // address 0 before entries were checked).
        let why = edited(tmp.path(), &matmul(), |e| {
            e["launch"]["tensor_maps"][1]["buffer"] = 3.into();
        });
        assert_eq!(
            why,
            EntryError::MapBuffer {
                map: 1,
                buffer: 3,
                buffers: 3
            }
        );
        assert_eq!(
            why.to_string(),
            "its tensor map 1 is of buffer 3, but the kernel takes 3 buffers"
        );
        // Nor is a split kernel's workspace, the pointer after the buffers, mapped.
        let mut cache = DeployCache::open(tmp.path().join("split")).unwrap();
        let mut launch = wgmma_launch();
        launch.workspace_bytes = 4096;
        launch.tensor_maps[1].buffer = 3;
        let kernel = testkit::cubin(KERNEL, &[POINTER, POINTER, POINTER, POINTER, MAP, MAP], 0);
        let err = cache.store(new(&matmul(), launch), &kernel).unwrap_err();
        assert!(err.to_string().contains("map 1 is of buffer 3"), "{err}");
    }

    #[test]
    fn a_tensor_map_must_fit_its_buffer() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = |name| {
            let dir = tmp.path().join(name);
            wgmma_cache(&dir);
            dir
        };
        // Another element type than the buffer's.
        let why = edited(&dir("type"), &matmul(), |e| {
            e["launch"]["tensor_maps"][0]["tensor"]["dtype"] = "f32".into();
        });
        assert_eq!(
            why.to_string(),
            "its tensor map 0 reads f32 elements from buffer 0 (input: 65536 fp16)"
        );
        // Twice the rows of B: past its end.
        let why = edited(&dir("extent"), &matmul(), |e| {
            e["launch"]["tensor_maps"][1]["tensor"]["dims"][1] = 512.into();
        });
        assert_eq!(
            why.to_string(),
            "its tensor map 1 reaches 262144 bytes into buffer 1 (weight: 65536 fp16), which holds 131072"
        );
        // A box TMA cannot copy.
        let why = edited(&dir("box"), &matmul(), |e| {
            e["launch"]["tensor_maps"][0]["tensor"]["boxed"][0] = 512.into();
        });
        assert!(matches!(why, EntryError::MapRule { map: 0, .. }), "{why}");
    }

    #[test]
    fn an_invalid_convolution_shape_is_an_error_not_a_panic() {
        let conv = Task::new(
            schedule::parse_shape("conv2d", "1,64,56,56,64,3,3,1,1").unwrap(),
            Default::default(),
        )
        .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = DeployCache::open(tmp.path()).unwrap();
        let kernel = testkit::cubin(KERNEL, &[POINTER; 3], 0);
        let stored = cache
            .store(new(&conv, LaunchConfig::linear(392, 128, 0)), &kernel)
            .unwrap()
            .entry;
        // A window larger than the padded input: serde builds it, and deriving its sizes
        // (the buffers, from the contraction) panics; opening the cache refuses it.
        let mut wide = conv;
        let schedule::Operator::Conv2d(c) = &mut wide.op else {
            unreachable!("a convolution")
        };
        c.r = 99;
        assert!(std::panic::catch_unwind(|| wide.contraction()).is_err());
        let why = edited(tmp.path(), &conv, |e| e["shape"]["r"] = 99.into());
        assert!(
            why.to_string()
                .starts_with("its shape is not a valid task ("),
            "{why}"
        );
        // A valid shape, of another task than the key names.
        let why = edited(tmp.path(), &conv, |e| {
            e["shape"]["r"] = 3.into();
            e["shape"]["k"] = 32.into();
        });
        assert_eq!(
            why.to_string(),
            "its shape is task conv2d_n1_c64_h56_w56_k32_r3_s3_st1_p1, not conv2d_n1_c64_h56_w56_k64_r3_s3_st1_p1"
        );
        // An entry written before shapes were recorded opens; its launch is refused.
        let index = tmp.path().join(INDEX_FILE);
        let mut json: Value =
            serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
        json["entries"][0].as_object_mut().unwrap().remove("shape");
        std::fs::write(&index, json.to_string()).unwrap();
        let cache = DeployCache::load(tmp.path()).unwrap();
        let old = cache.lookup(H200, (9, 0), &stored.task).unwrap();
        assert_eq!(crate::params_of(old), Err(EntryError::NoShape));
    }

    /// Kernels the lowering generates, compiled by NVRTC (no GPU needed), pass the
    /// checks with the launch they come with: `wgmma` ones (tensor maps of matrices and
    /// of an im2col walk, a split one's workspace) and CUDA-core ones; a `wgmma` one
    /// without its maps is refused. The parameter records as ptxas writes them.
    #[test]
    fn generated_kernels_agree_with_their_entries() {
        let spec = schedule::GpuSpec::h100();
        let f32_conv = Task::new(
            schedule::parse_shape("conv2d", "1,64,56,56,64,3,3,1,1").unwrap(),
            Default::default(),
        )
        .unwrap();
        let tasks = [
            typed("matmul", "1024,1024,1024", schedule::Layout::Nchw),
            typed("conv2d", "1,64,56,56,64,3,3,1,1", schedule::Layout::Nhwc),
            typed("matmul", "16,4096,4096", schedule::Layout::Nchw),
            f32_conv,
        ];
        // Per task, the first kernel sampled with tensor maps, with a workspace, and
        // without maps.
        let picks: [fn(&LaunchConfig) -> bool; 3] = [
            |l| !l.tensor_maps.is_empty(),
            |l| l.workspace_bytes > 0,
            |l| l.tensor_maps.is_empty(),
        ];
        let mut jobs: Vec<(Task, schedule::GeneratedKernel)> = Vec::new();
        for task in tasks {
            let generated: Vec<_> = schedule::Sampler::new(&task, &spec, 1)
                .sample_distinct(48)
                .iter()
                .filter_map(|s| schedule::generate(&task, s, &spec).ok())
                .collect();
            for pick in picks {
                if let Some(k) = generated.iter().find(|k| pick(&k.launch))
                    && !jobs.iter().any(|(_, j)| j.source == k.source)
                {
                    jobs.push((task, k.clone()));
                }
            }
        }
        let compiled: Vec<Vec<u8>> = std::thread::scope(|scope| {
            let threads: Vec<_> = jobs
                .iter()
                .map(|(_, k)| {
                    scope.spawn(|| {
                        let arch = k.launch.target.arch("sm_90");
                        gpu::compile(&k.source, &k.name, &arch).unwrap().cubin
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let (mut mapped, mut im2col, mut split) = (0, 0, 0);
        for ((task, k), cubin) in jobs.iter().zip(&compiled) {
            let entry = DeployEntry {
                gpu: H200.to_string(),
                compute_capability: (9, 0),
                task: task.key(),
                shape: Some(*task),
                kernel: k.name.clone(),
                launch: k.launch.clone(),
                cubin: "cubins/k.cubin".to_string(),
                sha256: String::new(),
                stage1_us: 1.0,
                final_us: 1.0,
                stage: Stage::Stage1,
                created_by: TOOL_VERSION.to_string(),
            };
            check(&entry, cubin).unwrap_or_else(|e| panic!("{task} {}: {e}", k.name));
            let maps = k.launch.tensor_maps.len();
            split += usize::from(k.launch.workspace_bytes > 0);
            if maps == 0 {
                continue;
            }
            mapped += 1;
            im2col += k
                .launch
                .tensor_maps
                .iter()
                .filter(|m| m.tensor.im2col.is_some())
                .count();
            let mut lost = entry.clone();
            lost.launch.tensor_maps.clear();
            let pointers = crate::params_of(&entry).unwrap().len();
            assert_eq!(
                check(&lost, cubin),
                Err(EntryError::ParamCount {
                    kernel: k.name.clone(),
                    takes: pointers + maps,
                    pointers,
                    maps: 0
                })
            );
        }
        assert!(
            mapped >= 3 && im2col >= 1 && split >= 1 && jobs.len() > mapped,
            "{} kernels: {mapped} with maps, {im2col} im2col maps, {split} split",
            jobs.len()
        );
    }
}
