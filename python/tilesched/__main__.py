"""`python -m tilesched tasks`: a PyTorch model's task list for `tilesched tune --tasks`.

    python -m tilesched tasks --model torchvision:resnet50 --batch 1 --dtype fp16 \\
        --channels-last --out resnet50-b1.tasks.jsonl

`--model` is `torchvision:NAME` (torchvision.models.get_model, untrained weights: the
shapes are what matters) or `MODULE:CALLABLE` returning a model. The input is random,
of `--input-shape` (default 3,224,224) at `--batch`. Exit status 2 with one line on
stderr for bad arguments or a model that cannot be traced.
"""

import argparse
import importlib
import sys


def load_model(spec):
    source, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"--model {spec!r}: give torchvision:NAME or MODULE:CALLABLE")
    if source == "torchvision":
        import torchvision
        return torchvision.models.get_model(name, weights=None)
    return getattr(importlib.import_module(source), name)()


def add_model_arguments(parser, dtype="f32"):
    """The options naming a model and its input (also read by benchmarks/e2e/e2e.py)."""
    parser.add_argument("--model", required=True, help="torchvision:NAME or MODULE:CALLABLE")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--input-shape", default="3,224,224")
    parser.add_argument("--dtype", choices=("f32", "fp16", "bf16"), default=dtype)
    parser.add_argument("--channels-last", action="store_true")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tilesched")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tasks", help="write a model's task list")
    add_model_arguments(t)
    t.add_argument("--device", default=None, help="where to run the shape pass (default: cuda if present)")
    t.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        import torch
        from tilesched import torch as tt
        from tilesched.keys import TaskError
        from tilesched.patterns import count_labels
        shape = [int(v) for v in args.input_shape.split(",")]
        if args.batch < 1 or any(v < 1 for v in shape):
            raise ValueError("--batch and --input-shape must be positive")
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = {"f32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
        fmt = torch.channels_last if args.channels_last else torch.contiguous_format
        model = load_model(args.model).eval().to(device=device, dtype=dtype, memory_format=fmt)
        x = torch.randn([args.batch] + shape, device=device, dtype=dtype).contiguous(memory_format=fmt)
        pairs = tt.write_tasks(model, x, args.out)
    except (ValueError, TaskError, ImportError, AttributeError, RuntimeError) as e:
        print(f"python -m tilesched: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 2
    layers = sum(c for _, c in pairs)
    print(f"{args.out}: {len(pairs)} tasks, {layers} kernels per pass "
          f"({count_labels(t.op for t, c in pairs for _ in range(c))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
