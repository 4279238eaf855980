//! ONNX import against hand-written expectations. Every model is built here as ONNX
//! protobuf with the prost types tract-onnx exposes (weights are zero initializers of
//! the right shapes), so the tests need no file and no Python.

use onnx::{InputShape, OnnxError, import, import_bytes, parse_input};
use prost::Message;
use schedule::network::network;
use schedule::{Epilogue, Task, Workload, parse_shape};
use std::path::Path;
use tract_onnx::pb::{
    self, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    attribute_proto::AttributeType, tensor_proto::DataLocation, tensor_proto::DataType,
    tensor_shape_proto::Dimension, tensor_shape_proto::dimension, type_proto,
};

// ---------------------------------------------------------------------------------------
// A small graph builder.

#[derive(Default)]
struct Model {
    graph: GraphProto,
}

/// A declared input dimension: fixed or symbolic.
enum D {
    V(i64),
    P(&'static str),
}

fn typed(elem_type: DataType, dims: &[D]) -> TypeProto {
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: elem_type as i32,
            shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|d| Dimension {
                        value: Some(match d {
                            D::V(v) => dimension::Value::DimValue(*v),
                            D::P(p) => dimension::Value::DimParam(p.to_string()),
                        }),
                        ..Default::default()
                    })
                    .collect(),
            }),
        })),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i: v,
        ..Default::default()
    }
}

fn float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Float as i32,
        f: v,
        ..Default::default()
    }
}

fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::String as i32,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn zeros(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        raw_data: vec![0; 4 * n as usize],
        ..Default::default()
    }
}

fn int64s(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![values.len() as i64],
        data_type: DataType::Int64 as i32,
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

impl Model {
    fn input(mut self, name: &str, dims: &[D]) -> Self {
        self.graph.input.push(ValueInfoProto {
            name: name.into(),
            r#type: Some(typed(DataType::Float, dims)),
            ..Default::default()
        });
        self
    }

    fn x(self, dims: &[i64]) -> Self {
        let dims: Vec<D> = dims.iter().map(|&d| D::V(d)).collect();
        self.input("x", &dims)
    }

    fn weight(mut self, name: &str, dims: &[i64]) -> Self {
        self.graph.initializer.push(zeros(name, dims));
        self
    }

    fn node(
        mut self,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> Self {
        self.graph.node.push(NodeProto {
            name: format!("{}_{}", op.to_lowercase(), self.graph.node.len()),
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        });
        self
    }

    fn output(mut self, name: &str) -> Self {
        self.graph.output.push(ValueInfoProto {
            name: name.into(),
            ..Default::default()
        });
        self
    }

    fn bytes(self) -> Vec<u8> {
        self.proto().encode_to_vec()
    }

    fn proto(self) -> ModelProto {
        ModelProto {
            ir_version: 8,
            producer_name: "tilesched-tests".into(),
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(GraphProto {
                name: "test".into(),
                ..self.graph
            }),
            ..Default::default()
        }
    }

    fn import(self) -> onnx::OnnxModel {
        import_bytes(&self.bytes(), &[], 1).unwrap_or_else(|e| panic!("import failed: {e}"))
    }
}

fn model() -> Model {
    Model::default()
}

fn task(op: &str, spec: &str, bias: bool, relu: bool) -> Task {
    Task::new(parse_shape(op, spec).unwrap(), Epilogue { bias, relu }).unwrap()
}

fn conv(spec: &str) -> Task {
    task("conv2d", spec, false, false)
}

fn once(tasks: &[Task]) -> Vec<Workload> {
    tasks
        .iter()
        .map(|&task| Workload { task, count: 1 })
        .collect()
}

fn not_tuned(list: &[(&str, u32)]) -> Vec<(String, u32)> {
    list.iter().map(|&(o, n)| (o.to_string(), n)).collect()
}

// ---------------------------------------------------------------------------------------
// Conv attributes.

#[test]
fn strides_and_asymmetric_pads() {
    let m = model()
        .x(&[1, 3, 32, 32])
        .weight("w", &[8, 3, 3, 3])
        .node(
            "Conv",
            &["x", "w"],
            &["y"],
            vec![ints("strides", &[2, 2]), ints("pads", &[1, 0, 2, 1])],
        )
        .output("y")
        .import();
    assert_eq!(
        m.workloads,
        once(&[conv(
            "c=3,h=32,w=32,k=8,r=3,s=3,stride=2,pad_h=1,pad_w=0,pad_bottom=2,pad_right=1"
        )])
    );
    assert!(m.not_tuned.is_empty());
    assert_eq!(m.not_tuned_line(), None);
    let Some(schedule::Operator::Conv2d(c)) = m.workloads.first().map(|w| w.task.op) else {
        panic!()
    };
    // ONNX's output for these pads: floor((32 + 1 + 2 - 3) / 2) + 1 = 17 rows,
    // floor((32 + 0 + 1 - 3) / 2) + 1 = 16 columns.
    assert_eq!(c.output_size().unwrap(), (17, 16));
}

#[test]
fn auto_pad_same_upper_at_stride_two_pads_only_the_end() {
    let m = model()
        .x(&[1, 8, 8, 8])
        .weight("w", &[8, 8, 3, 3])
        .node(
            "Conv",
            &["x", "w"],
            &["y"],
            vec![string("auto_pad", "SAME_UPPER"), ints("strides", &[2, 2])],
        )
        .output("y")
        .import();
    let expected = conv("c=8,h=8,w=8,k=8,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1");
    assert_eq!(expected.key(), "conv2d_n1_c8_h8_w8_k8_r3_s3_st2_p0_pe1");
    assert_eq!(m.workloads, once(&[expected]));
}

#[test]
fn auto_pad_same_upper_and_lower_put_the_odd_row_at_opposite_ends() {
    // A 4x4 kernel at stride 1 needs 3 rows of padding: SAME_UPPER puts 2 at the end,
    // SAME_LOWER 2 at the beginning; both keep the 8x8 output.
    let same = |mode: &str| {
        model()
            .x(&[1, 4, 8, 8])
            .weight("w", &[4, 4, 4, 4])
            .node("Conv", &["x", "w"], &["y"], vec![string("auto_pad", mode)])
            .output("y")
            .import()
            .workloads
    };
    assert_eq!(
        same("SAME_UPPER"),
        once(&[conv(
            "c=4,h=8,w=8,k=4,r=4,s=4,pad=1,pad_bottom=2,pad_right=2"
        )])
    );
    assert_eq!(
        same("SAME_LOWER"),
        once(&[conv(
            "c=4,h=8,w=8,k=4,r=4,s=4,pad=2,pad_bottom=1,pad_right=1"
        )])
    );
    // SAME_LOWER at stride 2 with a 3x3 kernel on 8: one row at the beginning, which is
    // the plain pad-1 convolution (the end pad changes nothing and leaves the key).
    let lower = model()
        .x(&[1, 8, 8, 8])
        .weight("w", &[8, 8, 3, 3])
        .node(
            "Conv",
            &["x", "w"],
            &["y"],
            vec![string("auto_pad", "SAME_LOWER"), ints("strides", &[2, 2])],
        )
        .output("y")
        .import();
    assert_eq!(
        lower.workloads,
        once(&[conv("c=8,h=8,w=8,k=8,r=3,s=3,stride=2,pad=1")])
    );
    // VALID pads nothing even when pads are given.
    let valid = model()
        .x(&[1, 4, 8, 8])
        .weight("w", &[4, 4, 3, 3])
        .node(
            "Conv",
            &["x", "w"],
            &["y"],
            vec![string("auto_pad", "VALID")],
        )
        .output("y")
        .import();
    assert_eq!(valid.workloads, once(&[conv("1,4,8,8,4,3,3,1,0")]));
}

#[test]
fn dilation_groups_and_depthwise() {
    let m = model()
        .x(&[1, 8, 16, 16])
        .weight("wd", &[8, 8, 3, 3])
        .weight("wg", &[16, 4, 3, 3])
        .weight("wdw", &[16, 1, 3, 3])
        .node(
            "Conv",
            &["x", "wd"],
            &["a"],
            vec![ints("dilations", &[2, 2]), ints("pads", &[2, 2, 2, 2])],
        )
        .node(
            "Conv",
            &["a", "wg"],
            &["b"],
            vec![int("group", 2), ints("pads", &[1, 1, 1, 1])],
        )
        .node(
            "Conv",
            &["b", "wdw"],
            &["y"],
            vec![
                int("group", 16),
                ints("pads", &[1, 1, 1, 1]),
                ints("kernel_shape", &[3, 3]),
            ],
        )
        .output("y")
        .import();
    assert_eq!(
        m.workloads,
        once(&[
            conv("c=8,h=16,w=16,k=8,r=3,s=3,pad=2,dilation=2"),
            conv("c=8,h=16,w=16,k=16,r=3,s=3,pad=1,groups=2"),
            conv("c=16,h=16,w=16,k=16,r=3,s=3,pad=1,groups=16"),
        ])
    );
    assert_eq!(
        m.workloads[2].task.key(),
        "conv2d_n1_c16_h16_w16_k16_r3_s3_st1_p1_g16"
    );
}

// ---------------------------------------------------------------------------------------
// Epilogues.

#[test]
fn conv_bias_input_and_relu_fuse() {
    let m = model()
        .x(&[1, 3, 8, 8])
        .weight("w", &[16, 3, 3, 3])
        .weight("b", &[16])
        .node(
            "Conv",
            &["x", "w", "b"],
            &["c"],
            vec![ints("pads", &[1, 1, 1, 1])],
        )
        .node("Relu", &["c"], &["y"], vec![])
        .output("y")
        .import();
    assert_eq!(
        m.workloads,
        once(&[task("conv2d", "1,3,8,8,16,3,3,1,1", true, true)])
    );
    assert_eq!(m.not_tuned_line(), None);
}

#[test]
fn a_following_add_of_a_channel_constant_is_the_bias() {
    // [1,K,1,1] as an initializer and [K,1,1] as a Constant node: both fuse (the
    // Constant node with them); a [K] constant broadcasts along the width, not the
    // channels, and stays a separate Add.
    let constant = NodeProto {
        name: "bias_const".into(),
        op_type: "Constant".into(),
        output: vec!["bc".into()],
        attribute: vec![AttributeProto {
            name: "value".into(),
            r#type: AttributeType::Tensor as i32,
            t: Some(zeros("", &[8, 1, 1])),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut m = model()
        .x(&[1, 8, 8, 8])
        .weight("w", &[8, 8, 1, 1])
        .weight("b4", &[1, 8, 1, 1])
        .weight("b1", &[8]);
    m.graph.node.push(constant);
    let m = m
        .node("Conv", &["x", "w"], &["c1"], vec![])
        .node("Add", &["c1", "b4"], &["a1"], vec![])
        .node("Relu", &["a1"], &["r1"], vec![])
        .node("Conv", &["r1", "w"], &["c2"], vec![])
        .node("Add", &["bc", "c2"], &["a2"], vec![])
        .node("Conv", &["a2", "w"], &["c3"], vec![])
        .node("Add", &["c3", "b1"], &["y"], vec![])
        .output("y")
        .import();
    assert_eq!(
        m.workloads,
        vec![
            Workload {
                task: task("conv2d", "1,8,8,8,8,1,1,1,0", true, true),
                count: 1
            },
            Workload {
                task: task("conv2d", "1,8,8,8,8,1,1,1,0", true, false),
                count: 1
            },
            Workload {
                task: conv("1,8,8,8,8,1,1,1,0"),
                count: 1
            },
        ]
    );
    assert_eq!(m.not_tuned, not_tuned(&[("Add", 1)]));
}

#[test]
fn a_tensor_with_other_consumers_is_not_fused() {
    // The conv's output feeds both the Relu and a residual Add: fusing the Relu would
    // lose the unrectified value.
    let m = model()
        .x(&[1, 8, 8, 8])
        .weight("w", &[8, 8, 3, 3])
        .node(
            "Conv",
            &["x", "w"],
            &["c"],
            vec![ints("pads", &[1, 1, 1, 1])],
        )
        .node("Relu", &["c"], &["r"], vec![])
        .node("Add", &["r", "c"], &["y"], vec![])
        .output("y")
        .import();
    assert_eq!(m.workloads, once(&[conv("1,8,8,8,8,3,3,1,1")]));
    assert_eq!(m.not_tuned, not_tuned(&[("Add", 1), ("Relu", 1)]));
    // Nor is an Add whose input is also a graph output.
    let m = model()
        .x(&[1, 8, 8, 8])
        .weight("w", &[8, 8, 3, 3])
        .weight("b", &[1, 8, 1, 1])
        .node(
            "Conv",
            &["x", "w"],
            &["c"],
            vec![ints("pads", &[1, 1, 1, 1])],
        )
        .node("Add", &["c", "b"], &["y"], vec![])
        .output("c")
        .output("y")
        .import();
    assert_eq!(m.workloads, once(&[conv("1,8,8,8,8,3,3,1,1")]));
}

// ---------------------------------------------------------------------------------------
// Matrix products.

#[test]
fn gemm_with_transposes_and_bias() {
    // A is K x M = 16 x 4 (transA), B is N x K = 10 x 16 (transB): a 4 x 10 x 16 matmul.
    let m = model()
        .input("a", &[D::V(16), D::V(4)])
        .weight("b", &[10, 16])
        .weight("c", &[10])
        .node(
            "Gemm",
            &["a", "b", "c"],
            &["g"],
            vec![int("transA", 1), int("transB", 1)],
        )
        .node("Relu", &["g"], &["y"], vec![])
        .output("y")
        .import();
    assert_eq!(m.workloads, once(&[task("matmul", "4,10,16", true, true)]));
    // No transposes, C of [1, N]; alpha != 1 is not tuned; a full [M, N] C is not a bias.
    let m = model()
        .input("a", &[D::V(4), D::V(16)])
        .weight("b", &[16, 10])
        .weight("c", &[1, 10])
        .weight("cmn", &[4, 10])
        .node("Gemm", &["a", "b", "c"], &["g1"], vec![])
        .node("Gemm", &["a", "b"], &["g2"], vec![float("alpha", 0.5)])
        .node("Gemm", &["a", "b", "cmn"], &["g3"], vec![])
        .node("Gemm", &["a", "b", "c"], &["g4"], vec![float("beta", 2.0)])
        .output("g1")
        .output("g2")
        .output("g3")
        .output("g4")
        .import();
    assert_eq!(m.workloads, once(&[task("matmul", "4,10,16", true, false)]));
    assert_eq!(m.not_tuned, not_tuned(&[("Gemm", 3)]));
}

#[test]
fn matmul_2d_3d_batched_and_broadcast() {
    let m = model()
        .input("a2", &[D::V(4), D::V(16)])
        .input("a3", &[D::V(2), D::V(5), D::V(16)])
        .input("q", &[D::V(3), D::V(5), D::V(16)])
        .input("k", &[D::V(3), D::V(16), D::V(7)])
        .weight("w", &[16, 8])
        .weight("bias", &[8])
        .node("MatMul", &["a2", "w"], &["y1"], vec![])
        .node("MatMul", &["a3", "w"], &["m3"], vec![])
        .node("Add", &["m3", "bias"], &["y2"], vec![])
        .node("MatMul", &["q", "k"], &["y3"], vec![])
        // [4, 16] x [3, 16, 7]: A broadcast over B's batch, no such task.
        .node("MatMul", &["a2", "k"], &["y4"], vec![])
        .output("y1")
        .output("y2")
        .output("y3")
        .output("y4")
        .import();
    assert_eq!(
        m.workloads,
        once(&[
            task("matmul", "4,8,16", false, false),
            // A Linear over [2, 5, 16]: 10 rows.
            task("matmul", "10,8,16", true, false),
            task("batch_matmul", "3,5,7,16", false, false),
        ])
    );
    assert_eq!(m.not_tuned, not_tuned(&[("MatMul", 1)]));
}

// ---------------------------------------------------------------------------------------
// Shapes only inference knows, counts, listing.

#[test]
fn shapes_through_pooling_flatten_and_reshape_come_from_inference() {
    let m = model()
        .x(&[1, 3, 32, 32])
        .weight("w1", &[8, 3, 7, 7])
        .weight("w2", &[8, 8, 3, 3])
        .weight("fc", &[10, 8])
        .weight("proj", &[512, 6])
        .node(
            "Conv",
            &["x", "w1"],
            &["c1"],
            vec![ints("strides", &[2, 2]), ints("pads", &[3, 3, 3, 3])],
        )
        .node(
            "MaxPool",
            &["c1"],
            &["p"],
            vec![
                ints("kernel_shape", &[3, 3]),
                ints("strides", &[2, 2]),
                ints("pads", &[1, 1, 1, 1]),
            ],
        )
        .node(
            "Conv",
            &["p", "w2"],
            &["c2"],
            vec![ints("pads", &[1, 1, 1, 1])],
        )
        .node("GlobalAveragePool", &["c2"], &["g"], vec![])
        .node("Flatten", &["g"], &["f"], vec![])
        .node("Gemm", &["f", "fc"], &["y"], vec![int("transB", 1)])
        .output("y")
        // The pooled [1, 8, 8, 8] reshaped to [-1, 512]: one row.
        .node("Reshape", &["p", "shape"], &["r"], vec![])
        .node("MatMul", &["r", "proj"], &["z"], vec![])
        .output("z");
    let mut m = m;
    m.graph.initializer.push(int64s("shape", &[-1, 512]));
    let m = m.import();
    assert_eq!(
        m.workloads,
        once(&[
            conv("1,3,32,32,8,7,7,2,3"),
            conv("1,8,8,8,8,3,3,1,1"),
            task("matmul", "1,10,8", false, false),
            task("matmul", "1,6,512", false, false),
        ])
    );
    assert_eq!(
        m.not_tuned_line().as_deref(),
        Some("not tuned: 1 Flatten, 1 GlobalAveragePool, 1 MaxPool, 1 Reshape")
    );
}

#[test]
fn a_repeated_layer_is_one_task_counted_twice() {
    let m = model()
        .x(&[1, 8, 8, 8])
        .weight("w1", &[8, 8, 3, 3])
        .weight("w2", &[8, 8, 3, 3])
        .weight("w3", &[4, 8, 1, 1])
        .node(
            "Conv",
            &["x", "w1"],
            &["a"],
            vec![ints("pads", &[1, 1, 1, 1])],
        )
        .node("Conv", &["a", "w3"], &["b"], vec![])
        .node(
            "Conv",
            &["a", "w2"],
            &["c"],
            vec![ints("pads", &[1, 1, 1, 1])],
        )
        .output("b")
        .output("c")
        .import();
    assert_eq!(
        m.workloads,
        vec![
            Workload {
                task: conv("1,8,8,8,8,3,3,1,1"),
                count: 2
            },
            Workload {
                task: conv("1,8,8,8,4,1,1,1,0"),
                count: 1
            },
        ]
    );
}

#[test]
fn a_miniature_resnet_keeps_batch_norm_separate_and_lists_it() {
    // stem conv -> BN -> Relu -> MaxPool, then a basic block with its residual Add.
    let bn = |m: Model, x: &str, y: &str, c: i64, p: &str| {
        m.weight(&format!("{p}_s"), &[c])
            .weight(&format!("{p}_b"), &[c])
            .weight(&format!("{p}_m"), &[c])
            .weight(&format!("{p}_v"), &[c])
            .node(
                "BatchNormalization",
                &[
                    x,
                    &format!("{p}_s"),
                    &format!("{p}_b"),
                    &format!("{p}_m"),
                    &format!("{p}_v"),
                ],
                &[y],
                vec![],
            )
    };
    let m = model()
        .x(&[1, 3, 64, 64])
        .weight("w0", &[16, 3, 7, 7])
        .weight("w1", &[16, 16, 3, 3])
        .weight("w2", &[16, 16, 3, 3])
        .node(
            "Conv",
            &["x", "w0"],
            &["c0"],
            vec![ints("strides", &[2, 2]), ints("pads", &[3, 3, 3, 3])],
        );
    let m = bn(m, "c0", "n0", 16, "bn0")
        .node("Relu", &["n0"], &["r0"], vec![])
        .node(
            "MaxPool",
            &["r0"],
            &["p0"],
            vec![
                ints("kernel_shape", &[3, 3]),
                ints("strides", &[2, 2]),
                ints("pads", &[1, 1, 1, 1]),
            ],
        )
        .node(
            "Conv",
            &["p0", "w1"],
            &["c1"],
            vec![ints("pads", &[1, 1, 1, 1])],
        );
    let m = bn(m, "c1", "n1", 16, "bn1")
        .node("Relu", &["n1"], &["r1"], vec![])
        .node(
            "Conv",
            &["r1", "w2"],
            &["c2"],
            vec![ints("pads", &[1, 1, 1, 1])],
        );
    let m = bn(m, "c2", "n2", 16, "bn2")
        .node("Add", &["n2", "p0"], &["s"], vec![])
        .node("Relu", &["s"], &["y"], vec![])
        .output("y")
        .import();
    // Plain convolutions, as in --network resnet50: BN sits between conv and Relu.
    assert_eq!(
        m.workloads,
        vec![
            Workload {
                task: conv("1,3,64,64,16,7,7,2,3"),
                count: 1
            },
            Workload {
                task: conv("1,16,16,16,16,3,3,1,1"),
                count: 2
            },
        ]
    );
    assert_eq!(
        m.not_tuned_line().as_deref(),
        Some("not tuned: 3 BatchNormalization, 3 Relu, 1 Add, 1 MaxPool")
    );
}

#[test]
fn resnet50_stem_key_matches_the_built_in_network() {
    // Logs are shared between --onnx and --network: the same layer, the same key.
    let m = model()
        .x(&[1, 3, 224, 224])
        .weight("w", &[64, 3, 7, 7])
        .node(
            "Conv",
            &["x", "w"],
            &["y"],
            vec![
                ints("strides", &[2, 2]),
                ints("pads", &[3, 3, 3, 3]),
                ints("dilations", &[1, 1]),
                int("group", 1),
                ints("kernel_shape", &[7, 7]),
            ],
        )
        .output("y")
        .import();
    assert_eq!(m.workloads[0].task, network("resnet50", 1).unwrap()[0].task);
}

#[test]
fn other_ranks_and_unknown_ops_are_listed_not_dropped() {
    let mut m = model()
        .input("s", &[D::V(1), D::V(4), D::V(32)])
        .weight("w1", &[4, 4, 3])
        .node("Conv", &["s", "w1"], &["c"], vec![ints("pads", &[1, 1])])
        .node("Clip", &["c"], &["y"], vec![])
        .output("y");
    m.graph.node.push(NodeProto {
        name: "custom".into(),
        op_type: "FusedThing".into(),
        domain: "com.example".into(),
        input: vec!["y".into()],
        output: vec!["z".into()],
        ..Default::default()
    });
    let m = m.output("z").import();
    assert!(m.workloads.is_empty());
    assert_eq!(
        m.not_tuned_line().as_deref(),
        Some("not tuned: 1 Clip, 1 Conv, 1 com.example.FusedThing")
    );
}

// ---------------------------------------------------------------------------------------
// Inputs and errors.

#[test]
fn a_symbolic_batch_takes_the_batch_and_inputs_fix_shapes() {
    let build = || {
        model()
            .input("image", &[D::P("N"), D::V(3), D::P("H"), D::V(16)])
            .weight("w", &[8, 3, 3, 3])
            .node(
                "Conv",
                &["image", "w"],
                &["y"],
                vec![ints("pads", &[1, 1, 1, 1])],
            )
            .output("y")
            .bytes()
    };
    let err = import_bytes(&build(), &[], 4).unwrap_err();
    assert!(matches!(err, OnnxError::UnknownDim { dim: 2, .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "input 'image' dimension 2 is not fixed by the model ('H'): give its shape with --input image=D1,D2,..."
    );
    let given = [parse_input("image=2,3,24,16").unwrap()];
    let m = import_bytes(&build(), &given, 4).unwrap();
    assert_eq!(m.workloads, once(&[conv("2,3,24,16,8,3,3,1,1")]));
    assert_eq!(m.inputs, given);

    // Only the first dimension defaults to the batch.
    let m = model()
        .input("image", &[D::P("N"), D::V(3), D::V(8), D::V(8)])
        .weight("w", &[8, 3, 3, 3])
        .node("Conv", &["image", "w"], &["y"], vec![])
        .output("y")
        .bytes();
    let m = import_bytes(&m, &[], 4).unwrap();
    assert_eq!(m.workloads, once(&[conv("4,3,8,8,8,3,3,1,0")]));
    assert_eq!(m.inputs[0].to_string(), "image=4,3,8,8");
}

#[test]
fn input_specs_parse_and_bad_ones_are_errors() {
    assert_eq!(
        "input:0=1,3,224,224".parse::<InputShape>().unwrap(),
        InputShape {
            name: "input:0".into(),
            shape: vec![1, 3, 224, 224]
        }
    );
    for bad in ["x", "=1,2", "x=1,,2", "x=1,0", "x=a"] {
        let e = parse_input(bad).unwrap_err();
        assert!(matches!(e, OnnxError::BadInputSpec { .. }), "{bad}: {e}");
    }
}

#[test]
fn an_unknown_input_name_is_one_line_listing_the_inputs() {
    let bytes = model()
        .x(&[1, 3, 8, 8])
        .weight("w", &[8, 3, 3, 3])
        .node("Conv", &["x", "w"], &["y"], vec![])
        .output("y")
        .bytes();
    let err = import_bytes(&bytes, &[parse_input("data=1,3,8,8").unwrap()], 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the model has no input 'data' (its inputs: x)"
    );
    // A weight is no input, even where an old exporter listed it as one.
    let err = import_bytes(&bytes, &[parse_input("w=8,3,3,3").unwrap()], 1).unwrap_err();
    assert!(matches!(err, OnnxError::UnknownInput { .. }), "{err}");
    let err = import_bytes(&bytes, &[parse_input("x=1,3,8").unwrap()], 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--input x gives 3 dimensions but the model declares 4"
    );
}

#[test]
fn unreadable_and_malformed_models_are_one_line_errors() {
    let dir = std::env::temp_dir().join(format!("tilesched-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.onnx");
    let err = import(&missing, &[], 1).unwrap_err();
    assert!(matches!(err, OnnxError::Read { .. }), "{err}");
    assert!(
        err.to_string().starts_with("cannot read ONNX model "),
        "{err}"
    );

    let garbage = dir.join("garbage.onnx");
    std::fs::write(&garbage, b"\xff\xff\xff\xff this is not protobuf\n\n").unwrap();
    let err = import(&garbage, &[], 1).unwrap_err();
    assert!(matches!(err, OnnxError::Decode { .. }), "{err}");

    // A real model through the file path as well.
    let good = dir.join("good.onnx");
    std::fs::write(
        &good,
        model()
            .x(&[1, 3, 8, 8])
            .weight("w", &[8, 3, 3, 3])
            .node("Conv", &["x", "w"], &["y"], vec![])
            .output("y")
            .bytes(),
    )
    .unwrap();
    assert_eq!(
        import(&good, &[], 1).unwrap().workloads,
        once(&[conv("1,3,8,8,8,3,3,1,0")])
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let errors = [
        err,
        import_bytes(&ModelProto::default().encode_to_vec(), &[], 1).unwrap_err(),
        // A node reading a tensor nothing produces.
        import_bytes(
            &model()
                .x(&[1, 3, 8, 8])
                .node("Relu", &["nowhere"], &["y"], vec![])
                .output("y")
                .bytes(),
            &[],
            1,
        )
        .unwrap_err(),
        // An output nothing produces.
        import_bytes(&model().x(&[1, 3, 8, 8]).output("y").bytes(), &[], 1).unwrap_err(),
        // An input with no type.
        import_bytes(
            &{
                let mut m = model();
                m.graph.input.push(ValueInfoProto {
                    name: "x".into(),
                    ..Default::default()
                });
                m.output("x").bytes()
            },
            &[],
            1,
        )
        .unwrap_err(),
        // A weight of an element type ONNX does not define.
        import_bytes(
            &{
                let mut m = model().x(&[1, 3, 8, 8]);
                let mut w = zeros("w", &[8, 3, 3, 3]);
                w.data_type = 99;
                m.graph.initializer.push(w);
                m.node("Conv", &["x", "w"], &["y"], vec![])
                    .output("y")
                    .bytes()
            },
            &[],
            1,
        )
        .unwrap_err(),
        // Channels that disagree with the weight.
        import_bytes(
            &model()
                .x(&[1, 3, 8, 8])
                .weight("w", &[8, 4, 3, 3])
                .node("Conv", &["x", "w"], &["y"], vec![])
                .output("y")
                .bytes(),
            &[],
            1,
        )
        .unwrap_err(),
        // Pads of the wrong arity.
        import_bytes(
            &model()
                .x(&[1, 3, 8, 8])
                .weight("w", &[8, 3, 3, 3])
                .node("Conv", &["x", "w"], &["y"], vec![ints("pads", &[1, 1])])
                .output("y")
                .bytes(),
            &[],
            1,
        )
        .unwrap_err(),
        import_bytes(&[], &[], 0).unwrap_err(),
    ];
    for e in &errors {
        let line = e.to_string();
        assert!(!line.contains('\n') && !line.is_empty(), "{line:?}");
    }
    assert!(
        matches!(errors[1], OnnxError::NoGraph { .. }),
        "{}",
        errors[1]
    );
    assert!(
        matches!(errors[2], OnnxError::Malformed(_)),
        "{}",
        errors[2]
    );
    assert!(
        matches!(errors[3], OnnxError::Malformed(_)),
        "{}",
        errors[3]
    );
    assert!(
        matches!(errors[4], OnnxError::NotATensor { .. }),
        "{}",
        errors[4]
    );
    assert!(
        matches!(errors[5], OnnxError::Malformed(_)),
        "{}",
        errors[5]
    );
}

#[test]
fn arbitrary_bytes_never_panic() {
    // Truncations and bit flips of a valid model: each is a model or an error.
    let bytes = model()
        .x(&[1, 3, 8, 8])
        .weight("w", &[8, 3, 3, 3])
        .weight("b", &[1, 8, 1, 1])
        .node(
            "Conv",
            &["x", "w"],
            &["c"],
            vec![ints("pads", &[1, 1, 1, 1])],
        )
        .node("Add", &["c", "b"], &["y"], vec![])
        .output("y")
        .bytes();
    for cut in (0..bytes.len()).step_by(7) {
        let _ = import_bytes(&bytes[..cut], &[], 1);
    }
    for i in (0..bytes.len()).step_by(3) {
        let mut flipped = bytes.clone();
        flipped[i] ^= 0x5a;
        let _ = import_bytes(&flipped, &[], 1);
    }
    let _ = pb::ModelProto::decode(&bytes[..]).unwrap();
}

// ---------------------------------------------------------------------------------------
// Real models: the graphs `benchmarks/onnx/export.py` wrote from torchvision (torch
// 2.11) with their weights left out in ONNX external data the importer never reads.

fn data(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

#[test]
fn resnet50_export_gives_the_built_in_network() {
    let m = import(&data("resnet50.onnx"), &[], 1).unwrap();
    // Its 53 convolutions in the built-in list's order, then the classifier.
    let mut expected = network("resnet50", 1).unwrap();
    expected.push(Workload {
        task: task("matmul", "1,1000,2048", true, false),
        count: 1,
    });
    assert_eq!(m.workloads, expected);
    assert_eq!(
        m.not_tuned_line().as_deref(),
        Some(
            "not tuned: 200 Identity, 53 BatchNormalization, 49 Relu, 16 Add, 1 Flatten, \
             1 GlobalAveragePool, 1 MaxPool"
        )
    );
    assert_eq!(m.inputs[0].to_string(), "input=1,3,224,224");
}

#[test]
fn mobilenet_v2_export_gives_depthwise_convs_with_folded_bias() {
    let m = import(&data("mobilenet_v2.onnx"), &[], 1).unwrap();
    let conv = |spec: &str, count: u32| Workload {
        task: task("conv2d", spec, true, false),
        count,
    };
    let dw = |c: u32, hw: u32, stride: u32, count: u32| {
        conv(
            &format!("c={c},h={hw},w={hw},k={c},r=3,s=3,stride={stride},pad=1,groups={c}"),
            count,
        )
    };
    let pw =
        |c: u32, hw: u32, k: u32, count: u32| conv(&format!("1,{c},{hw},{hw},{k},1,1,1,0"), count);
    let expected = vec![
        conv("1,3,224,224,32,3,3,2,1", 1),
        dw(32, 112, 1, 1),
        pw(32, 112, 16, 1),
        pw(16, 112, 96, 1),
        dw(96, 112, 2, 1),
        pw(96, 56, 24, 1),
        pw(24, 56, 144, 2),
        dw(144, 56, 1, 1),
        pw(144, 56, 24, 1),
        dw(144, 56, 2, 1),
        pw(144, 28, 32, 1),
        pw(32, 28, 192, 3),
        dw(192, 28, 1, 2),
        pw(192, 28, 32, 2),
        dw(192, 28, 2, 1),
        pw(192, 14, 64, 1),
        pw(64, 14, 384, 4),
        dw(384, 14, 1, 4),
        pw(384, 14, 64, 3),
        pw(384, 14, 96, 1),
        pw(96, 14, 576, 3),
        dw(576, 14, 1, 2),
        pw(576, 14, 96, 2),
        dw(576, 14, 2, 1),
        pw(576, 7, 160, 1),
        pw(160, 7, 960, 3),
        dw(960, 7, 1, 3),
        pw(960, 7, 160, 2),
        pw(960, 7, 320, 1),
        pw(320, 7, 1280, 1),
        Workload {
            task: task("matmul", "1,1000,1280", true, false),
            count: 1,
        },
    ];
    assert_eq!(m.workloads, expected);
    assert_eq!(
        m.workloads.iter().map(|w| w.count).sum::<u32>(),
        53,
        "52 convolutions and the classifier"
    );
    // ReLU6 is a Clip: not fused, listed.
    assert_eq!(
        m.not_tuned_line().as_deref(),
        Some(
            "not tuned: 70 Constant, 39 Identity, 35 Clip, 10 Add, 1 Flatten, \
             1 GlobalAveragePool"
        )
    );
    // At batch 8 through --input: every task's batch follows.
    let m8 = import(
        &data("mobilenet_v2.onnx"),
        &[parse_input("input=8,3,224,224").unwrap()],
        1,
    )
    .unwrap();
    assert!(m8.workloads[0].task.key().starts_with("conv2d_n8_c3_h224"));
    assert_eq!(
        m8.workloads.last().unwrap().task.key(),
        "matmul_m8_n1000_k1280_bias"
    );
}

#[test]
fn a_shape_tract_cannot_infer_names_the_node_that_needs_it() {
    let mut m = model().x(&[1, 3, 8, 8]).weight("w", &[8, 3, 3, 3]);
    m.graph.node.push(NodeProto {
        name: "mystery".into(),
        op_type: "Mystery".into(),
        domain: "com.example".into(),
        input: vec!["x".into()],
        output: vec!["m".into()],
        ..Default::default()
    });
    let bytes = m
        .node("Conv", &["m", "w"], &["y"], vec![])
        .output("y")
        .bytes();
    let err = import_bytes(&bytes, &[], 1).unwrap_err();
    let line = err.to_string();
    assert!(
        matches!(&err, OnnxError::Shape { node, tensor, .. } if node == "conv_1" && tensor == "m"),
        "{line}"
    );
    assert!(
        line.starts_with("cannot infer the shape of 'm' (data of Conv node 'conv_1'): "),
        "{line}"
    );
    assert!(
        line.ends_with(" (from com.example.Mystery node 'mystery')"),
        "{line}"
    );
    assert!(!line.contains('\n'), "{line}");
}

/// Window attributes tract would divide by (a zero stride made it panic) are refused
/// before tract sees the model, in one line naming the node and the attribute.
#[test]
fn window_attributes_are_checked_before_tract() {
    let conv_with = |attrs: Vec<AttributeProto>| {
        import_bytes(
            &model()
                .x(&[1, 3, 8, 8])
                .weight("w", &[8, 3, 3, 3])
                .node("Conv", &["x", "w"], &["y"], attrs)
                .output("y")
                .bytes(),
            &[],
            1,
        )
    };
    for (attrs, name) in [
        (vec![ints("strides", &[0, 0])], "strides"),
        (vec![ints("dilations", &[1, 0])], "dilations"),
        (vec![ints("pads", &[0, -1, 0, 0])], "pads"),
        (vec![int("group", 0)], "group"),
        (vec![ints("kernel_shape", &[0, 3])], "kernel_shape"),
    ] {
        let e = conv_with(attrs).unwrap_err();
        let line = e.to_string();
        assert!(matches!(e, OnnxError::Malformed(_)), "{line}");
        assert!(line.contains(&format!("attribute '{name}'")), "{line}");
        assert!(line.contains("at least"), "{line}");
    }
    // The same attributes elsewhere are not windows: a Pad (opset < 11) may crop.
    let pad = import_bytes(
        &model()
            .x(&[1, 3, 8, 8])
            .node(
                "Pad",
                &["x"],
                &["y"],
                vec![ints("pads", &[0, 0, -1, 0, 0, 0, 0, 0])],
            )
            .output("y")
            .bytes(),
        &[],
        1,
    );
    assert!(
        !matches!(&pad, Err(OnnxError::Malformed(m)) if m.contains("at least")),
        "{:?}",
        pad.err().map(|e| e.to_string())
    );
}

/// A model path must be a regular file of at most 2 GiB: a FIFO would block the read, a
/// device would never end it, a directory is no model.
#[test]
fn model_files_are_regular_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.onnx");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let huge = dir.path().join("huge.onnx");
    // Sparse: 3 GiB of nothing on disk.
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    for path in [fifo.as_path(), Path::new("/dev/zero"), dir.path()] {
        let e = import(path, &[], 1).unwrap_err();
        assert!(matches!(e, OnnxError::NotAFile { .. }), "{e}");
    }
    let e = import(&huge, &[], 1).unwrap_err();
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("3221225472 bytes"), "{e}");
}

/// A fixed batch out of range (2^40, 0, negative) is the model's error, never replaced by
/// `--batch` as a symbolic one is; `--input` overrides it.
#[test]
fn an_out_of_range_fixed_batch_is_refused_not_replaced() {
    for batch in [1i64 << 40, 0, -3] {
        let bytes = model()
            .input("x", &[D::V(batch), D::V(3), D::V(8), D::V(8)])
            .weight("w", &[8, 3, 3, 3])
            .node("Conv", &["x", "w"], &["y"], vec![])
            .output("y")
            .bytes();
        let e = import_bytes(&bytes, &[], 1).unwrap_err();
        assert!(matches!(e, OnnxError::DimRange { .. }), "{batch}: {e}");
        assert!(e.to_string().contains(&format!("is {batch},")), "{e}");
        let given = [parse_input("x=2,3,8,8").unwrap()];
        let m = import_bytes(&bytes, &given, 1).unwrap();
        assert_eq!(m.inputs[0].shape, [2, 3, 8, 8]);
    }
}

// ---------------------------------------------------------------------------------------
// External data: every initializer's bytes in one file beside the model, as
// `onnx.save_model(..., save_as_external_data=True, all_tensors_to_one_file=True,
// size_threshold=0)` writes them.

fn entry(key: &str, value: impl ToString) -> StringStringEntryProto {
    StringStringEntryProto {
        key: key.into(),
        value: value.to_string(),
    }
}

/// Moves `t`'s data to the end of `data`, leaving `t` an external reference to it.
fn externalize_tensor(t: &mut TensorProto, location: &str, data: &mut Vec<u8>) {
    let mut bytes = std::mem::take(&mut t.raw_data);
    bytes.extend(t.float_data.drain(..).flat_map(f32::to_le_bytes));
    bytes.extend(t.int64_data.drain(..).flat_map(i64::to_le_bytes));
    t.data_location = Some(DataLocation::External as i32);
    t.external_data = vec![
        entry("location", location),
        entry("offset", data.len()),
        entry("length", bytes.len()),
    ];
    data.extend(bytes);
}

/// The model with every initializer external in `location`, and that file's bytes.
fn externalize(model: ModelProto, location: &str) -> (Vec<u8>, Vec<u8>) {
    let mut model = model;
    let mut data = Vec::new();
    for t in &mut model.graph.as_mut().unwrap().initializer {
        externalize_tensor(t, location, &mut data);
    }
    (model.encode_to_vec(), data)
}

/// Conv (small bias) -> Relu -> Flatten, or Reshape to [1, 512] through an int64
/// initializer -> Gemm (small bias). The biases (8 and 10 floats) stay constants when
/// their data is there; the Reshape's shape is last in the data file.
fn classifier(reshape: bool) -> ModelProto {
    let m = model()
        .x(&[1, 3, 8, 8])
        .weight("w", &[8, 3, 3, 3])
        .weight("b", &[8])
        .weight("fc", &[512, 10])
        .weight("fcb", &[10])
        .node(
            "Conv",
            &["x", "w", "b"],
            &["c"],
            vec![ints("pads", &[1, 1, 1, 1])],
        )
        .node("Relu", &["c"], &["r"], vec![]);
    let mut m = if reshape {
        m.node("Reshape", &["r", "shape"], &["f"], vec![])
    } else {
        m.node("Flatten", &["r"], &["f"], vec![])
    };
    if reshape {
        m.graph.initializer.push(int64s("shape", &[1, 512]));
    }
    m.node("Gemm", &["f", "fc", "fcb"], &["y"], vec![])
        .output("y")
        .proto()
}

fn classifier_workloads() -> Vec<Workload> {
    once(&[
        task("conv2d", "1,3,8,8,8,3,3,1,1", true, true),
        task("matmul", "1,10,512", true, false),
    ])
}

/// Writes the model and its data file into `dir`, returning the model's path.
fn save(dir: &Path, model: &[u8], data: &[u8]) -> std::path::PathBuf {
    std::fs::write(dir.join("weights.bin"), data).unwrap();
    let path = dir.join("model.onnx");
    std::fs::write(&path, model).unwrap();
    path
}

#[test]
fn all_tensors_external_with_the_data_file_present_import_as_inline() {
    for reshape in [false, true] {
        let inline = import_bytes(&classifier(reshape).encode_to_vec(), &[], 1).unwrap();
        assert_eq!(inline.workloads, classifier_workloads());
        let dir = tempfile::tempdir().unwrap();
        let (bytes, data) = externalize(classifier(reshape), "weights.bin");
        let m = import(&save(dir.path(), &bytes, &data), &[], 1).unwrap();
        assert_eq!(m, inline, "reshape: {reshape}");
    }
}

/// Without the data file every float initializer, small biases included, is a typed
/// input: the conv and the Gemm come out with their fused biases. A Flatten needs no
/// data; a Reshape's shape is data, and without it tract cannot give the Gemm's input a
/// shape (it knows neither dimension of `[?, ?]`): that is one line naming the file, the
/// shape tensor and what needed it.
#[test]
fn all_tensors_external_without_the_data_file_import_from_the_graph() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, data) = externalize(classifier(false), "weights.bin");
    let path = save(dir.path(), &bytes, &data);
    std::fs::remove_file(dir.path().join("weights.bin")).unwrap();
    let m = import(&path, &[], 1).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.workloads, classifier_workloads());
    assert_eq!(m.not_tuned_line().as_deref(), Some("not tuned: 1 Flatten"));

    let (bytes, data) = externalize(classifier(true), "weights.bin");
    let path = save(dir.path(), &bytes, &data);
    std::fs::remove_file(dir.path().join("weights.bin")).unwrap();
    let e = import(&path, &[], 1).unwrap_err();
    assert!(matches!(e, OnnxError::ExternalMissing { .. }), "{e}");
    let file = dir.path().join("weights.bin");
    assert_eq!(
        e.to_string(),
        format!(
            "cannot infer the shape of 'f' (A of Gemm node 'gemm_3') without 'shape' \
             (read by Reshape node 'reshape_2'), whose external data {} is missing",
            file.display()
        )
    );

    // A data file cut short of the shape (the last tensor in it) is as good as missing
    // for the shape; the biases before it are read.
    let (bytes, data) = externalize(classifier(true), "weights.bin");
    let path = save(dir.path(), &bytes, &data[..data.len() - 1]);
    let line = import(&path, &[], 1).unwrap_err().to_string();
    let n = data.len();
    assert!(
        line.ends_with(&format!(
            "whose external data {} is {} bytes, short of its bytes {}..{n}",
            file.display(),
            n - 1,
            n - 16
        )),
        "{line}"
    );
    // The Flatten model with its last bias cut short: that bias is a typed input.
    let (bytes, data) = externalize(classifier(false), "weights.bin");
    let path = save(dir.path(), &bytes, &data[..data.len() - 1]);
    assert_eq!(
        import(&path, &[], 1).unwrap().workloads,
        classifier_workloads()
    );

    // From bytes there is no directory to look in: the same as a missing file.
    let (bytes, _) = externalize(classifier(false), "weights.bin");
    assert_eq!(
        import_bytes(&bytes, &[], 1).unwrap().workloads,
        classifier_workloads()
    );
    let (bytes, _) = externalize(classifier(true), "weights.bin");
    let e = import_bytes(&bytes, &[], 1).unwrap_err();
    assert!(
        e.to_string().ends_with(
            "whose external data weights.bin cannot be found: the model was not read from a file"
        ),
        "{e}"
    );
}

/// `Constant` nodes may hold their value externally too (`convert_attribute=True`): one
/// whose data is missing is a typed input to tract and still the node it was for the
/// task (a fused bias) and for the listing.
#[test]
fn constant_nodes_with_missing_external_data() {
    let constant = |name: &str, t: TensorProto| NodeProto {
        name: format!("{name}_const"),
        op_type: "Constant".into(),
        output: vec![name.into()],
        attribute: vec![AttributeProto {
            name: "value".into(),
            r#type: AttributeType::Tensor as i32,
            t: Some(t),
            ..Default::default()
        }],
        ..Default::default()
    };
    let build = |external: bool, matmul: bool| {
        let mut data = Vec::new();
        let mut bias = zeros("", &[1, 8, 1, 1]);
        let mut shape = int64s("", &[1, 512]);
        if external {
            externalize_tensor(&mut bias, "consts.bin", &mut data);
            externalize_tensor(&mut shape, "consts.bin", &mut data);
        }
        let mut m = model().x(&[1, 8, 8, 8]).weight("w", &[8, 8, 1, 1]);
        m.graph.node.push(constant("bc", bias));
        m.graph.node.push(constant("shape", shape));
        let m = m
            .node("Conv", &["x", "w"], &["c"], vec![])
            .node("Add", &["c", "bc"], &["a"], vec![])
            .output("a")
            .node("Reshape", &["a", "shape"], &["f"], vec![]);
        let m = if matmul {
            m.weight("proj", &[512, 4])
                .node("MatMul", &["f", "proj"], &["z"], vec![])
                .output("z")
        } else {
            m.output("f")
        };
        (m.bytes(), data)
    };
    let dir = tempfile::tempdir().unwrap();
    let (inline, _) = build(false, false);
    let inline = import_bytes(&inline, &[], 1).unwrap();
    assert_eq!(
        inline.workloads,
        once(&[task("conv2d", "1,8,8,8,8,1,1,1,0", true, false)])
    );
    assert_eq!(
        inline.not_tuned_line().as_deref(),
        Some("not tuned: 1 Constant, 1 Reshape")
    );
    let (bytes, data) = build(true, false);
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, &bytes).unwrap();
    std::fs::write(dir.path().join("consts.bin"), &data).unwrap();
    assert_eq!(import(&path, &[], 1).unwrap(), inline);
    // Missing: nothing needs the reshaped shape, so the import is the same.
    std::fs::remove_file(dir.path().join("consts.bin")).unwrap();
    assert_eq!(import(&path, &[], 1).unwrap(), inline);
    // A MatMul after the Reshape needs it: the error names the Constant's output.
    let (bytes, _) = build(true, true);
    std::fs::write(&path, &bytes).unwrap();
    let e = import(&path, &[], 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "cannot infer the shape of 'f' (A of MatMul node 'matmul_5') without 'shape' \
             (read by Reshape node 'reshape_4'), whose external data {} is missing",
            dir.path().join("consts.bin").display()
        )
    );
}

/// A reference to external data that cannot be right is the model's error, in one line,
/// before any file is looked for; so is missing data in a subgraph, whose inputs cannot
/// stand in for it.
#[test]
fn malformed_external_references_and_subgraph_data_are_one_line_errors() {
    let with = |edit: &dyn Fn(&mut TensorProto)| {
        let dir = tempfile::tempdir().unwrap();
        let mut proto = classifier(true);
        let mut data = Vec::new();
        let shape = proto
            .graph
            .as_mut()
            .unwrap()
            .initializer
            .last_mut()
            .unwrap();
        externalize_tensor(shape, "weights.bin", &mut data);
        edit(shape);
        let path = save(dir.path(), &proto.encode_to_vec(), &data);
        import(&path, &[], 1).unwrap_err().to_string()
    };
    let set = |key: &'static str, value: &'static str| {
        move |t: &mut TensorProto| {
            t.external_data.retain(|e| e.key != key);
            if !value.is_empty() {
                t.external_data.push(entry(key, value));
            }
        }
    };
    for (edit, line) in [
        (
            set("location", ""),
            "malformed model: tensor 'shape' is stored as external data but names no location",
        ),
        (
            set("offset", "-8"),
            "malformed model: tensor 'shape' has external data offset '-8', not a byte count",
        ),
        (
            set("length", "12"),
            "malformed model: tensor 'shape' has 12 bytes of external data, but its dimensions [2] take 16",
        ),
        (
            set("offset", "18446744073709551615"),
            "", // checked below: past the end of the file
        ),
    ] {
        let got = with(&edit);
        assert!(!got.contains('\n'), "{got}");
        if line.is_empty() {
            assert!(
                got.ends_with(
                    "is 16 bytes, short of its bytes 18446744073709551615..18446744073709551615"
                ),
                "{got}"
            );
        } else {
            assert_eq!(got, line);
        }
    }

    // An If whose branch holds external data that is not there.
    let dir = tempfile::tempdir().unwrap();
    let mut branch = model().weight("k", &[4]).output("k").graph;
    let mut data = Vec::new();
    externalize_tensor(&mut branch.initializer[0], "branch.bin", &mut data);
    let mut m = model().input("cond", &[]);
    m.graph.input[0].r#type = Some(typed(DataType::Bool, &[]));
    let m = m.node(
        "If",
        &["cond"],
        &["y"],
        vec![
            AttributeProto {
                name: "then_branch".into(),
                r#type: AttributeType::Graph as i32,
                g: Some(branch.clone()),
                ..Default::default()
            },
            AttributeProto {
                name: "else_branch".into(),
                r#type: AttributeType::Graph as i32,
                g: Some(branch),
                ..Default::default()
            },
        ],
    );
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, m.output("y").bytes()).unwrap();
    let e = import(&path, &[], 1).unwrap_err();
    assert!(matches!(e, OnnxError::ExternalNeeded { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "a subgraph of If node 'if_0' needs tensor 'k', whose external data {} is missing",
            dir.path().join("branch.bin").display()
        )
    );
    // With the file there, the branch's data is inlined and tract reads the model.
    std::fs::write(dir.path().join("branch.bin"), &data).unwrap();
    let m = import(&path, &[], 1).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.workloads.is_empty());
}

/// An external location must be a relative path that stays in the model's directory,
/// through links too: anything else is refused in one line, file present or not, even
/// for a weight that is never read ('w', the first initializer). A link is only followed
/// for data that is read ('b', the first such).
#[test]
fn external_data_outside_the_model_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let (_, data) = externalize(classifier(true), "x.bin");
    std::fs::write(dir.path().join("x.bin"), &data).unwrap();
    std::os::unix::fs::symlink("../x.bin", models.join("link.bin")).unwrap();
    for (location, tensor, reason) in [
        ("../x.bin", "w", "leaves the model's directory"),
        ("/etc/passwd", "w", "is an absolute path"),
        ("sub/../../x.bin", "w", "leaves the model's directory"),
        (
            "link.bin",
            "b",
            "leads outside the model's directory through a link",
        ),
    ] {
        let (bytes, _) = externalize(classifier(true), location);
        let path = models.join("model.onnx");
        std::fs::write(&path, &bytes).unwrap();
        let e = import(&path, &[], 1).unwrap_err();
        assert!(
            matches!(e, OnnxError::ExternalPath { .. }),
            "{location}: {e}"
        );
        let line = e.to_string();
        assert_eq!(
            line,
            format!(
                "external data '{location}' of tensor '{tensor}' {reason}: it must be a relative path inside the model's directory"
            )
        );
    }
    // A control character in a location is escaped: the error stays one line.
    let (bytes, _) = externalize(classifier(true), "../a\nb.bin");
    std::fs::write(models.join("model.onnx"), &bytes).unwrap();
    let line = import(&models.join("model.onnx"), &[], 1)
        .unwrap_err()
        .to_string();
    assert!(
        line.starts_with("external data '../a\\nb.bin' of tensor 'w'"),
        "{line}"
    );
}

/// Ops that take a shape, axes or bounds as int64 data: with that data missing, the
/// conv after them has no shape, and the error says which tensor and file it needs.
#[test]
fn shape_operands_with_missing_external_data_are_named() {
    for op in ["Slice", "Unsqueeze", "Expand", "Pad", "Tile"] {
        let mut m = model().x(&[1, 8, 8, 8]).weight("w", &[8, 8, 1, 1]);
        m.graph.initializer.push(int64s("k", &[0, 0, 0, 0]));
        let ins: &[&str] = if op == "Slice" {
            &["x", "k", "k"]
        } else {
            &["x", "k"]
        };
        let m = m
            .node(op, ins, &["u"], vec![])
            .node("Conv", &["u", "w"], &["y"], vec![])
            .output("y");
        let (bytes, _) = externalize(m.proto(), "gone.bin");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, bytes).unwrap();
        let e = import(&path, &[], 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "cannot infer the shape of 'u' (data of Conv node 'conv_1') without 'k' \
                 (read by {op} node '{}_0'), whose external data {} is missing",
                op.to_lowercase(),
                dir.path().join("gone.bin").display()
            )
        );
    }
}
