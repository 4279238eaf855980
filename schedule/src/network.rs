//! Named workload sets: the layers of a network as tasks with their occurrence counts.
//!
//! Sources: `resnet` and `yolo` are the conv2d sets of the Ansor-AF-DS study (ICS'24;
//! lists `sizesResnet` and `sizesYolo` in the HPCRL/Ansor-AF-DS artifact, the YOLO ones
//! being the distinct convolutions of darknet's YOLOv2 layers 0–19 at 544×544);
//! `resnet50` and `resnet18` are torchvision's architectures at 224×224 (stride on the
//! 3×3 convolution, "ResNet v1.5"), `mobilenet_v2` torchvision's MobileNetV2 at 224×224;
//! `bert-base` is one BERT-base encoder layer at
//! sequence length 128 (hidden 768, 12 heads of 64, FFN 3072) times its 12 layers.

use crate::task::{Conv2d, Epilogue, Operator, Task, TaskError};
use thiserror::Error;

/// A task of a network and how many times the network runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub task: Task,
    pub count: u32,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum NetworkError {
    #[error("unknown network '{0}' (known: {known})", known = NETWORKS.join(", "))]
    Unknown(String),
    #[error("batch size must be at least 1")]
    ZeroBatch,
    #[error("batch size {0} makes a dimension larger than 32 bits hold")]
    BatchTooLarge(u32),
    #[error(transparent)]
    Task(#[from] TaskError),
}

/// The networks `--network` accepts.
pub const NETWORKS: &[&str] = &[
    "resnet",
    "resnet50",
    "resnet18",
    "mobilenet_v2",
    "yolo",
    "bert-base",
];

/// `N,C,H,W,K,R,S,stride,pad` of a square convolution with batch 1.
type ConvRow = [u32; 9];

const RESNET_AFDS: &[ConvRow] = &[
    [1, 3, 224, 224, 64, 7, 7, 2, 3],
    [1, 64, 56, 56, 64, 1, 1, 1, 0],
    [1, 64, 56, 56, 64, 3, 3, 1, 1],
    [1, 64, 56, 56, 256, 1, 1, 1, 0],
    [1, 256, 56, 56, 128, 1, 1, 2, 0],
    [1, 128, 28, 28, 128, 3, 3, 1, 1],
    [1, 128, 28, 28, 512, 1, 1, 1, 0],
    [1, 512, 28, 28, 256, 1, 1, 2, 0],
    [1, 256, 14, 14, 256, 3, 3, 1, 1],
    [1, 256, 14, 14, 1024, 1, 1, 1, 0],
    [1, 1024, 14, 14, 512, 1, 1, 2, 0],
    [1, 512, 7, 7, 512, 3, 3, 1, 1],
    [1, 512, 7, 7, 2048, 1, 1, 1, 0],
];

const YOLO_AFDS: &[ConvRow] = &[
    [1, 3, 544, 544, 32, 3, 3, 1, 1],
    [1, 32, 272, 272, 64, 3, 3, 1, 1],
    [1, 64, 136, 136, 128, 3, 3, 1, 1],
    [1, 128, 136, 136, 64, 1, 1, 1, 0],
    [1, 128, 68, 68, 256, 3, 3, 1, 1],
    [1, 256, 68, 68, 128, 1, 1, 1, 0],
    [1, 256, 34, 34, 512, 3, 3, 1, 1],
    [1, 512, 34, 34, 256, 1, 1, 1, 0],
    [1, 512, 17, 17, 1024, 3, 3, 1, 1],
    [1, 1024, 17, 17, 512, 1, 1, 1, 0],
];

/// Every unique convolution of torchvision's ResNet-50 with its count (53 in all).
const RESNET50: &[(ConvRow, u32)] = &[
    ([1, 3, 224, 224, 64, 7, 7, 2, 3], 1),
    // stage 1 (56x56), 3 blocks; the first block's 1x1 from 64 channels and its downsample
    ([1, 64, 56, 56, 64, 1, 1, 1, 0], 1),
    ([1, 64, 56, 56, 64, 3, 3, 1, 1], 3),
    ([1, 64, 56, 56, 256, 1, 1, 1, 0], 4),
    ([1, 256, 56, 56, 64, 1, 1, 1, 0], 2),
    // stage 2 (28x28), 4 blocks
    ([1, 256, 56, 56, 128, 1, 1, 1, 0], 1),
    ([1, 128, 56, 56, 128, 3, 3, 2, 1], 1),
    ([1, 128, 28, 28, 512, 1, 1, 1, 0], 4),
    ([1, 256, 56, 56, 512, 1, 1, 2, 0], 1),
    ([1, 512, 28, 28, 128, 1, 1, 1, 0], 3),
    ([1, 128, 28, 28, 128, 3, 3, 1, 1], 3),
    // stage 3 (14x14), 6 blocks
    ([1, 512, 28, 28, 256, 1, 1, 1, 0], 1),
    ([1, 256, 28, 28, 256, 3, 3, 2, 1], 1),
    ([1, 256, 14, 14, 1024, 1, 1, 1, 0], 6),
    ([1, 512, 28, 28, 1024, 1, 1, 2, 0], 1),
    ([1, 1024, 14, 14, 256, 1, 1, 1, 0], 5),
    ([1, 256, 14, 14, 256, 3, 3, 1, 1], 5),
    // stage 4 (7x7), 3 blocks
    ([1, 1024, 14, 14, 512, 1, 1, 1, 0], 1),
    ([1, 512, 14, 14, 512, 3, 3, 2, 1], 1),
    ([1, 512, 7, 7, 2048, 1, 1, 1, 0], 3),
    ([1, 1024, 14, 14, 2048, 1, 1, 2, 0], 1),
    ([1, 2048, 7, 7, 512, 1, 1, 1, 0], 2),
    ([1, 512, 7, 7, 512, 3, 3, 1, 1], 2),
];

/// Every unique convolution of torchvision's ResNet-18 with its count (20 in all).
const RESNET18: &[(ConvRow, u32)] = &[
    ([1, 3, 224, 224, 64, 7, 7, 2, 3], 1),
    ([1, 64, 56, 56, 64, 3, 3, 1, 1], 4),
    ([1, 64, 56, 56, 128, 3, 3, 2, 1], 1),
    ([1, 128, 28, 28, 128, 3, 3, 1, 1], 3),
    ([1, 64, 56, 56, 128, 1, 1, 2, 0], 1),
    ([1, 128, 28, 28, 256, 3, 3, 2, 1], 1),
    ([1, 256, 14, 14, 256, 3, 3, 1, 1], 3),
    ([1, 128, 28, 28, 256, 1, 1, 2, 0], 1),
    ([1, 256, 14, 14, 512, 3, 3, 2, 1], 1),
    ([1, 512, 7, 7, 512, 3, 3, 1, 1], 3),
    ([1, 256, 14, 14, 512, 1, 1, 2, 0], 1),
];

/// Every unique convolution of torchvision's MobileNetV2 at 224×224 with its groups and
/// count (52 in all), in the order they first run: the stem, then per inverted
/// residual block the 1×1 expansion (absent in the first block), the 3×3 depthwise
/// convolution and the 1×1 projection, then the last 1×1 to 1280 channels. As an
/// inference graph exports them (batch norm folded into the convolution), each adds a
/// bias; ReLU6 is a clamp, which the epilogue does not fuse.
const MOBILENET_V2: &[(ConvRow, u32, u32)] = &[
    ([1, 3, 224, 224, 32, 3, 3, 2, 1], 1, 1),
    ([1, 32, 112, 112, 32, 3, 3, 1, 1], 32, 1),
    ([1, 32, 112, 112, 16, 1, 1, 1, 0], 1, 1),
    ([1, 16, 112, 112, 96, 1, 1, 1, 0], 1, 1),
    ([1, 96, 112, 112, 96, 3, 3, 2, 1], 96, 1),
    ([1, 96, 56, 56, 24, 1, 1, 1, 0], 1, 1),
    ([1, 24, 56, 56, 144, 1, 1, 1, 0], 1, 2),
    ([1, 144, 56, 56, 144, 3, 3, 1, 1], 144, 1),
    ([1, 144, 56, 56, 24, 1, 1, 1, 0], 1, 1),
    ([1, 144, 56, 56, 144, 3, 3, 2, 1], 144, 1),
    ([1, 144, 28, 28, 32, 1, 1, 1, 0], 1, 1),
    ([1, 32, 28, 28, 192, 1, 1, 1, 0], 1, 3),
    ([1, 192, 28, 28, 192, 3, 3, 1, 1], 192, 2),
    ([1, 192, 28, 28, 32, 1, 1, 1, 0], 1, 2),
    ([1, 192, 28, 28, 192, 3, 3, 2, 1], 192, 1),
    ([1, 192, 14, 14, 64, 1, 1, 1, 0], 1, 1),
    ([1, 64, 14, 14, 384, 1, 1, 1, 0], 1, 4),
    ([1, 384, 14, 14, 384, 3, 3, 1, 1], 384, 4),
    ([1, 384, 14, 14, 64, 1, 1, 1, 0], 1, 3),
    ([1, 384, 14, 14, 96, 1, 1, 1, 0], 1, 1),
    ([1, 96, 14, 14, 576, 1, 1, 1, 0], 1, 3),
    ([1, 576, 14, 14, 576, 3, 3, 1, 1], 576, 2),
    ([1, 576, 14, 14, 96, 1, 1, 1, 0], 1, 2),
    ([1, 576, 14, 14, 576, 3, 3, 2, 1], 576, 1),
    ([1, 576, 7, 7, 160, 1, 1, 1, 0], 1, 1),
    ([1, 160, 7, 7, 960, 1, 1, 1, 0], 1, 3),
    ([1, 960, 7, 7, 960, 3, 3, 1, 1], 960, 3),
    ([1, 960, 7, 7, 160, 1, 1, 1, 0], 1, 2),
    ([1, 960, 7, 7, 320, 1, 1, 1, 0], 1, 1),
    ([1, 320, 7, 7, 1280, 1, 1, 1, 0], 1, 1),
];

/// BERT-base, sequence 128: (B, M, N, K) with B = 0 for a plain matmul, and the count
/// over the 12 encoder layers. Q, K, V and the output projection are four 768x768
/// projections per layer; attention scores Q·Kᵀ and probabilities·V are batch matmuls
/// over the 12 heads.
const BERT_BASE: &[([u32; 4], u32)] = &[
    ([0, 128, 768, 768], 48),
    ([0, 128, 3072, 768], 12),
    ([0, 128, 768, 3072], 12),
    ([12, 128, 128, 64], 12),
    ([12, 128, 64, 128], 12),
];

fn conv(row: ConvRow, batch: u32) -> Result<Task, TaskError> {
    grouped_conv(row, 1, batch, Epilogue::default())
}

fn grouped_conv(
    row: ConvRow,
    groups: u32,
    batch: u32,
    epilogue: Epilogue,
) -> Result<Task, TaskError> {
    let [_, c, h, w, k, r, s, stride, pad] = row;
    Task::new(
        Operator::Conv2d(Conv2d {
            groups,
            ..Conv2d::new(batch, c, h, w, k, r, s, stride, pad)
        }),
        epilogue,
    )
}

/// The workloads of network `name` at batch size `batch`, in the network's order.
pub fn network(name: &str, batch: u32) -> Result<Vec<Workload>, NetworkError> {
    if batch == 0 {
        return Err(NetworkError::ZeroBatch);
    }
    let counted = |rows: &[(ConvRow, u32)]| -> Result<Vec<Workload>, NetworkError> {
        rows.iter()
            .map(|&(row, count)| {
                Ok(Workload {
                    task: conv(row, batch)?,
                    count,
                })
            })
            .collect()
    };
    let once = |rows: &[ConvRow]| counted(&rows.iter().map(|&r| (r, 1)).collect::<Vec<_>>());
    match name {
        "resnet" => once(RESNET_AFDS),
        "yolo" => once(YOLO_AFDS),
        "resnet50" => counted(RESNET50),
        "resnet18" => counted(RESNET18),
        "mobilenet_v2" => MOBILENET_V2
            .iter()
            .map(|&(row, groups, count)| {
                let bias = Epilogue {
                    bias: true,
                    relu: false,
                };
                Ok(Workload {
                    task: grouped_conv(row, groups, batch, bias)?,
                    count,
                })
            })
            .collect(),
        "bert-base" => BERT_BASE
            .iter()
            .map(|&([b, m, n, k], count)| {
                // Batch scales the tokens of a plain matmul and the heads' batch of a
                // batch matmul (B = batch * 12 heads).
                let scaled = |x: u32| {
                    x.checked_mul(batch)
                        .ok_or(NetworkError::BatchTooLarge(batch))
                };
                let op = if b == 0 {
                    Operator::Matmul {
                        m: scaled(m)?,
                        n,
                        k,
                    }
                } else {
                    Operator::BatchMatmul {
                        b: scaled(b)?,
                        m,
                        n,
                        k,
                    }
                };
                Ok(Workload {
                    task: Task::new(op, Epilogue::default())?,
                    count,
                })
            })
            .collect(),
        other => Err(NetworkError::Unknown(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(name: &str) -> u32 {
        network(name, 1).unwrap().iter().map(|w| w.count).sum()
    }

    #[test]
    fn layer_counts() {
        assert_eq!(network("resnet", 1).unwrap().len(), 13);
        assert_eq!(network("yolo", 1).unwrap().len(), 10);
        assert_eq!(total("resnet50"), 53);
        assert_eq!(total("resnet18"), 20);
        assert_eq!(total("mobilenet_v2"), 52);
        assert_eq!(network("mobilenet_v2", 1).unwrap().len(), 30);
        assert_eq!(total("bert-base"), 96);
    }

    #[test]
    fn unique_layers_are_unique() {
        for name in ["resnet50", "resnet18", "mobilenet_v2"] {
            let tasks = network(name, 1).unwrap();
            let mut keys: Vec<_> = tasks.iter().map(|w| w.task.key()).collect();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), tasks.len(), "{name}");
        }
    }

    #[test]
    fn mobilenet_v2_chains_its_shapes() {
        // Each depthwise layer keeps its channels; 17 of them, 10 unique.
        let w = network("mobilenet_v2", 1).unwrap();
        let depthwise: Vec<_> = w
            .iter()
            .filter_map(|w| match w.task.op {
                Operator::Conv2d(c) if c.groups > 1 => Some((c, w.count)),
                _ => None,
            })
            .collect();
        assert_eq!(depthwise.len(), 10);
        assert_eq!(depthwise.iter().map(|(_, n)| n).sum::<u32>(), 17);
        assert!(depthwise.iter().all(|(c, _)| c.groups == c.c && c.c == c.k));
        assert_eq!(
            w[1].task.key(),
            "conv2d_n1_c32_h112_w112_k32_r3_s3_st1_p1_g32_bias"
        );
    }

    #[test]
    fn a_batch_overflowing_32_bits_is_refused_not_wrapped() {
        // 128 tokens x 2^25 = 2^32: once wrapped to m = 0.
        assert_eq!(
            network("bert-base", 1 << 25).err(),
            Some(NetworkError::BatchTooLarge(1 << 25))
        );
    }

    #[test]
    fn batch_is_applied() {
        let w = network("resnet", 8).unwrap();
        assert!(w[0].task.key().starts_with("conv2d_n8_"));
        assert!(matches!(network("resnet", 0), Err(NetworkError::ZeroBatch)));
        assert!(matches!(network("vgg", 1), Err(NetworkError::Unknown(_))));
    }
}
