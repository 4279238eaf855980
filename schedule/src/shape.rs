//! Parsing the command line's `--shape` into an operator.
//!
//! conv2d: positional `N,C,H,W,K,R,S,stride,pad`, or key=value (`n=1,c=64,...`) which
//! also takes `stride_h`/`stride_w`/`pad_h`/`pad_w`/`dilation[_h|_w]` for asymmetric
//! layers, `pad_bottom`/`pad_right` where the end pads differ from the top/left ones, and
//! `groups` (depthwise: `groups` = `c`); matmul: `M,N,K` or `m=..,n=..,k=..`; batch matmul: `B,M,N,K` or key=value.

use crate::task::{Conv2d, Operator};
use std::collections::BTreeMap;
use thiserror::Error;

/// A shape string that does not describe an operator.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ShapeError {
    #[error("unknown operator '{0}' (expected conv2d, matmul or batch_matmul)")]
    UnknownOp(String),
    #[error("{op} shape '{spec}' needs {expected}")]
    Arity {
        op: &'static str,
        spec: String,
        expected: &'static str,
    },
    #[error("'{value}' for {field} is not a non-negative integer")]
    NotANumber { field: String, value: String },
    #[error("unknown {op} shape key '{key}' (known: {known})")]
    UnknownKey {
        op: &'static str,
        key: String,
        known: &'static str,
    },
    #[error("{op} shape is missing '{key}'")]
    Missing { op: &'static str, key: &'static str },
    #[error("shape mixes positional values and key=value pairs: '{0}'")]
    Mixed(String),
}

/// The operator families the command line accepts.
pub const OPERATORS: &[&str] = &["conv2d", "matmul", "batch_matmul"];

/// Parses `spec` as a shape of operator `op`.
pub fn parse_shape(op: &str, spec: &str) -> Result<Operator, ShapeError> {
    match op {
        "conv2d" => parse_conv2d(spec),
        "matmul" => {
            let v = parse_values("matmul", spec, &["m", "n", "k"], "M,N,K")?;
            Ok(Operator::Matmul {
                m: v["m"],
                n: v["n"],
                k: v["k"],
            })
        }
        "batch_matmul" => {
            let v = parse_values("batch_matmul", spec, &["b", "m", "n", "k"], "B,M,N,K")?;
            Ok(Operator::BatchMatmul {
                b: v["b"],
                m: v["m"],
                n: v["n"],
                k: v["k"],
            })
        }
        other => Err(ShapeError::UnknownOp(other.to_string())),
    }
}

fn number(field: &str, value: &str) -> Result<u32, ShapeError> {
    value.trim().parse().map_err(|_| ShapeError::NotANumber {
        field: field.to_string(),
        value: value.trim().to_string(),
    })
}

/// Splits a spec into either positional values or key=value pairs, keyed by name.
fn split(
    op: &'static str,
    spec: &str,
    positional: &[&'static str],
    known: &'static str,
    expected: &'static str,
) -> Result<BTreeMap<String, u32>, ShapeError> {
    let parts: Vec<&str> = spec.split(',').map(str::trim).collect();
    let keyed = parts.iter().filter(|p| p.contains('=')).count();
    if keyed > 0 && keyed < parts.len() {
        return Err(ShapeError::Mixed(spec.to_string()));
    }
    let mut values = BTreeMap::new();
    if keyed == 0 {
        if parts.len() != positional.len() {
            return Err(ShapeError::Arity {
                op,
                spec: spec.to_string(),
                expected,
            });
        }
        for (name, part) in positional.iter().zip(&parts) {
            values.insert(name.to_string(), number(name, part)?);
        }
    } else {
        for part in parts {
            let (key, value) = part.split_once('=').expect("counted as keyed");
            let key = key.trim().to_ascii_lowercase();
            if !known.split(", ").any(|k| k == key) {
                return Err(ShapeError::UnknownKey { op, key, known });
            }
            let v = number(&key, value)?;
            values.insert(key, v);
        }
    }
    Ok(values)
}

fn parse_values(
    op: &'static str,
    spec: &str,
    names: &[&'static str],
    expected: &'static str,
) -> Result<BTreeMap<String, u32>, ShapeError> {
    let known: &'static str = if names.len() == 3 {
        "m, n, k"
    } else {
        "b, m, n, k"
    };
    let values = split(op, spec, names, known, expected)?;
    for name in names {
        if !values.contains_key(*name) {
            return Err(ShapeError::Missing { op, key: name });
        }
    }
    Ok(values)
}

const CONV_KEYS: &str = "n, c, h, w, k, r, s, stride, stride_h, stride_w, pad, pad_h, pad_w, pad_bottom, pad_right, dilation, dilation_h, dilation_w, groups";

fn parse_conv2d(spec: &str) -> Result<Operator, ShapeError> {
    let positional = ["n", "c", "h", "w", "k", "r", "s", "stride", "pad"];
    let v = split(
        "conv2d",
        spec,
        &positional,
        CONV_KEYS,
        "N,C,H,W,K,R,S,stride,pad (or key=value pairs)",
    )?;
    let required = |key: &'static str| {
        v.get(key)
            .copied()
            .ok_or(ShapeError::Missing { op: "conv2d", key })
    };
    // A per-direction value overrides the symmetric one; the symmetric one its default.
    let either = |specific: &str, both: &str, default: u32| {
        v.get(specific)
            .or_else(|| v.get(both))
            .copied()
            .unwrap_or(default)
    };
    Ok(Operator::Conv2d(Conv2d {
        n: v.get("n").copied().unwrap_or(1),
        c: required("c")?,
        h: required("h")?,
        w: required("w")?,
        k: required("k")?,
        r: required("r")?,
        s: required("s")?,
        stride_h: either("stride_h", "stride", 1),
        stride_w: either("stride_w", "stride", 1),
        pad_h: either("pad_h", "pad", 0),
        pad_w: either("pad_w", "pad", 0),
        dilation_h: either("dilation_h", "dilation", 1),
        dilation_w: either("dilation_w", "dilation", 1),
        pad_bottom: v.get("pad_bottom").copied(),
        pad_right: v.get("pad_right").copied(),
        groups: v.get("groups").copied().unwrap_or(1),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{Epilogue, Task, TaskError};

    #[test]
    fn positional_and_keyed_conv2d_agree() {
        let a = parse_shape("conv2d", "1,512,7,7,512,3,3,1,1").unwrap();
        let b = parse_shape("conv2d", "n=1,c=512,h=7,w=7,k=512,r=3,s=3,stride=1,pad=1").unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn asymmetric_conv2d() {
        let op = parse_shape(
            "conv2d",
            "c=8,h=9,w=10,k=4,r=1,s=3,stride_h=2,pad_w=1,dilation_w=2",
        )
        .unwrap();
        let Operator::Conv2d(c) = op else { panic!() };
        assert_eq!(
            (c.n, c.stride_h, c.stride_w, c.pad_h, c.pad_w),
            (1, 2, 1, 0, 1)
        );
        assert_eq!((c.dilation_h, c.dilation_w), (1, 2));
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(matches!(
            parse_shape("conv2d", "1,2,3"),
            Err(ShapeError::Arity { .. })
        ));
        assert!(matches!(
            parse_shape("matmul", "4,-5,6"),
            Err(ShapeError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_shape("matmul", "m=4,n=5"),
            Err(ShapeError::Missing { key: "k", .. })
        ));
        assert!(matches!(
            parse_shape("conv2d", "c=1,h=2,w=2,k=1,r=1,s=1,bogus=3"),
            Err(ShapeError::UnknownKey { .. })
        ));
        assert!(matches!(
            parse_shape("conv2d", "c=1,2"),
            Err(ShapeError::Mixed(_))
        ));
        assert!(matches!(
            parse_shape("conv3d", "1"),
            Err(ShapeError::UnknownOp(_))
        ));
    }

    #[test]
    fn batch_matmul() {
        assert_eq!(
            parse_shape("batch_matmul", "12,128,128,64").unwrap(),
            Operator::BatchMatmul {
                b: 12,
                m: 128,
                n: 128,
                k: 64
            }
        );
    }

    #[test]
    fn groups_and_end_pads_in_keys_and_specs() {
        let depthwise =
            |spec: &str| Task::new(parse_shape("conv2d", spec).unwrap(), Epilogue::default());
        let dw = depthwise("c=32,h=112,w=112,k=32,r=3,s=3,pad=1,groups=32").unwrap();
        assert_eq!(dw.key(), "conv2d_n1_c32_h112_w112_k32_r3_s3_st1_p1_g32");
        assert_eq!(
            Task::new(
                parse_shape("conv2d", &dw.shape_spec()).unwrap(),
                Epilogue::default()
            )
            .unwrap(),
            dw
        );
        let c = dw.contraction();
        let names: Vec<_> = c.spatial.iter().map(|a| a.name).collect();
        assert_eq!(names, ["g", "p", "q"]);
        assert_eq!(c.reduction.len(), 2);
        assert_eq!(c.inputs[1].shape, vec![32, 3, 3]);
        // SAME_UPPER at stride 2 on an even input pads only the bottom and right.
        let same =
            depthwise("c=8,h=8,w=8,k=8,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1").unwrap();
        assert_eq!(same.key(), "conv2d_n1_c8_h8_w8_k8_r3_s3_st2_p0_pe1");
        let Operator::Conv2d(conv) = same.op else {
            unreachable!()
        };
        assert_eq!(conv.output_size().unwrap(), (4, 4));
        // An end pad that changes nothing is dropped: one key for one computation.
        let plain = depthwise("c=8,h=8,w=8,k=8,r=3,s=3,stride=2,pad=1").unwrap();
        let padded = depthwise("c=8,h=8,w=8,k=8,r=3,s=3,stride=2,pad=1,pad_bottom=0").unwrap();
        assert_eq!(plain, padded);
        assert_eq!(
            depthwise("c=6,h=8,w=8,k=8,r=3,s=3,groups=4"),
            Err(TaskError::Groups {
                groups: 4,
                c: 6,
                k: 8
            })
        );
        // Old logs (no groups, no end pads) read as before.
        let json = serde_json::to_string(&plain).unwrap();
        assert!(
            !json.contains("groups") && !json.contains("pad_bottom"),
            "{json}"
        );
    }
}
