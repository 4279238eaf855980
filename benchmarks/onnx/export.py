#!/usr/bin/env python3
"""Exports torchvision models to ONNX for `tilesched --onnx`.

Usage (on a machine with torch, torchvision and onnx; no network, no weights needed):

    python3 benchmarks/onnx/export.py OUT_DIR [--models resnet50 mobilenet_v2
        resnext50_32x4d convnext_tiny vit_b_16 efficientnet_b0 densenet121]

Writes OUT_DIR/<model>.onnx at batch 1, 3x224x224, opset 17, with the weights in
OUT_DIR/<model>.onnx.data beside it (ONNX external data): the importer needs only the
graph, so the small .onnx file alone imports, and the weights stay where they are useful.
Prints each model's node counts by op type and checks the property each model is for.

- resnet50: BatchNormalization stays a node of its own, so that the convolutions are
  the plain ones of `--network resnet50` (23 unique, 53 in all, no epilogue). The legacy
  TorchScript exporter folds BN into the preceding Conv in its eval-mode peephole pass,
  and in torch 2.x runs that pass only with constant folding on (torch/onnx/utils.py,
  `_model_to_graph`: `if do_constant_folding and ...: if training is None or training ==
  TrainingMode.EVAL: _jit_pass_onnx_eval_peephole`), so it exports with
  `do_constant_folding=False` in eval mode. Where the legacy exporter is gone, the
  dynamo exporter with `optimize=False` keeps BN as well. Either way the script checks
  that 53 BatchNormalization nodes came out.
- mobilenet_v2: the usual inference graph (eval mode, constant folding on): BN folded
  into the convolutions' bias, ReLU6 as Clip (which tilesched does not fuse).
- resnext50_32x4d, convnext_tiny, vit_b_16, efficientnet_b0: the usual inference graph
  as well, each checked for what it brings: grouped 3x3 convolutions (32 groups),
  7x7 depthwise convolutions and Linear layers, the transformer's matmuls, and
  EfficientNet-B0's 81 convolutions (depthwise 3x3 and 5x5, squeeze-excitation 1x1).
- densenet121: 120 convolutions without a bias (its batch norms come before them, so
  none folds), 66 of them of distinct shapes: the dense layers' 1x1 convolutions see a
  new channel count each. No tune of this project had seen it before 2026-11-28 (issue
  49's model nobody had tuned).
"""

import argparse
import collections
import os
import sys
import warnings

import onnx
import torch
import torchvision

OPSET = 17
SHAPE = (1, 3, 224, 224)


def export(model, path, fold_bn):
    """Exports `model` in eval mode to `path`; returns the exporter used."""
    model.eval()
    x = torch.zeros(SHAPE)
    common = dict(input_names=["input"], output_names=["logits"], opset_version=OPSET)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (x,),
                path,
                dynamo=False,
                do_constant_folding=fold_bn,
                training=torch.onnx.TrainingMode.EVAL,
                **common,
            )
        return "torchscript (dynamo=False, do_constant_folding=%s)" % fold_bn
    except (TypeError, RuntimeError, ImportError, AttributeError) as e:
        # torch versions without the legacy exporter.
        print(f"  legacy exporter unavailable ({type(e).__name__}: {e}); using dynamo")
        torch.onnx.export(model, (x,), path, dynamo=True, optimize=fold_bn, **common)
        return "dynamo (optimize=%s)" % fold_bn


def op_counts(model):
    return collections.Counter(node.op_type for node in model.graph.node)


def conv_groups(model):
    """The `group` attribute of every Conv node (1 where absent)."""
    groups = []
    for node in model.graph.node:
        if node.op_type == "Conv":
            g = [a.i for a in node.attribute if a.name == "group"]
            groups.append(g[0] if g else 1)
    return groups


# What each model is exported for, checked on the graph: (counts, conv groups,
# convs with a bias input) -> ok.
CHECKS = {
    "resnet50": lambda c, g, b: c.get("BatchNormalization", 0) == 53 and len(g) == 53 and b == 0,
    "mobilenet_v2": lambda c, g, b: c.get("BatchNormalization", 0) == 0 and len(g) == 52 and b == 52,
    "resnext50_32x4d": lambda c, g, b: len(g) == 53 and g.count(32) == 16 and b == 53,
    "convnext_tiny": lambda c, g, b: sum(1 for x in g if x > 1) == 18
    and c.get("MatMul", 0) + c.get("Gemm", 0) >= 36,
    "vit_b_16": lambda c, g, b: len(g) == 1 and c.get("MatMul", 0) + c.get("Gemm", 0) >= 48,
    "efficientnet_b0": lambda c, g, b: len(g) == 81 and b == 81,
    "densenet121": lambda c, g, b: len(g) == 120 and b == 0,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument(
        "--models", nargs="+", default=["resnet50", "mobilenet_v2"],
        choices=sorted(CHECKS),
    )
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, onnx {onnx.__version__}")
    failed = False
    for name in args.models:
        net = getattr(torchvision.models, name)(weights=None)
        path = os.path.join(args.out_dir, f"{name}.onnx")
        tmp = path + ".tmp"
        how = export(net, tmp, fold_bn=(name != "resnet50"))
        model = onnx.load(tmp)
        os.remove(tmp)
        # Tensors under 1 KiB (shape constants, Clip bounds) stay inline in the graph.
        data = os.path.basename(path) + ".data"
        if os.path.exists(os.path.join(args.out_dir, data)):
            os.remove(os.path.join(args.out_dir, data))
        onnx.save_model(
            model, path, save_as_external_data=True, all_tensors_to_one_file=True,
            location=data, size_threshold=1024,
        )
        onnx.checker.check_model(path)
        counts = op_counts(model)
        convs = counts.get("Conv", 0)
        with_bias = sum(
            1 for n in model.graph.node if n.op_type == "Conv" and len(n.input) > 2 and n.input[2]
        )
        print(f"{name}: {how}, opset {model.opset_import[0].version}, "
              f"{os.path.getsize(path)} bytes of graph")
        print("  nodes: " + ", ".join(f"{n} {op}" for op, n in counts.most_common()))
        print(f"  Conv: {convs}, of which with a bias input: {with_bias}")
        groups = conv_groups(model)
        print(f"  Conv groups other than 1: {sorted(set(x for x in groups if x > 1))}")
        ok = CHECKS[name](counts, groups, with_bias)
        print(f"  check: {'ok' if ok else 'FAILED'}")
        failed |= not ok
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
