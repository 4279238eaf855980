#!/usr/bin/env python3
"""Whole models timed end to end in PyTorch, with and without tilesched's kernels.

One process, one GPU, four configurations of the same model and input:

- `eager`: PyTorch eager (cudnn.benchmark on), captured in a CUDA graph;
- `eager+fold`: the same with each BatchNorm folded into its convolution by PyTorch's own
  `torch.fx.experimental.optimization.fuse` (models with BatchNorm only): eager at its
  inference best, so that folding is not counted as our kernels' gain;
- `eager+tilesched`: `tilesched.torch.optimize(model, deploy)`, captured in a CUDA graph;
- `compile`: `torch.compile(model, mode="max-autotune")` (Inductor's autotuned Triton and
  vendor kernels, CUDA graphs by the mode);
- `compile-frozen` (`--compile frozen`): the same with Inductor's `freezing` on, which
  folds BatchNorm into the convolutions' weights: PyTorch's strongest inference build;
- `compile+tilesched`: `torch.compile(optimized, mode="max-autotune")`: our operators
  inside the compiled graph, Inductor free to fuse and tune the rest.

Each configuration's latency is the median of `--samples` timings of one replay (one
call for the compiled sides, which replay their own CUDA graphs), the configurations
interleaved round by round so that clocks and the machine's other work affect them
alike. Two figures per configuration: `gpu` (the GPU busy-waits before each sample, so
the host's work to launch it, dynamo's guards included, never lands in the sample: the
work on the GPU) and `wall` (no busy-wait: what one call costs a waiting caller). Every output is compared with float32 eager PyTorch on the same weights, and
with fp16/bf16 eager's own error beside it: the swapped model must be within
`--tolerance` of the largest reference value.

The model's BatchNorm statistics are calibrated on random batches first (torchvision's
untrained weights would leave them at 0 and 1, which makes folding trivial), and a
Linear layer initialized to zeros (ViT's head) gets random weights, so that the output
carries every layer's error.

    python3 benchmarks/e2e/e2e.py --model torchvision:resnet50 --batch 1 --dtype fp16 \\
        --channels-last --deploy deploy-r50 --out e2e-resnet50-fp16-b1

Writes OUT/e2e.json and OUT/e2e.md and prints the markdown. Exit status 0 when every
swapped model was within tolerance, 1 otherwise, 2 for bad arguments.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

CONFIGS = ("eager", "eager+fold", "eager+tilesched", "compile", "compile-frozen", "compile+tilesched")
# Busy-wait before each `gpu` sample: longer than any side's host work per call.
SPIN_CYCLES = 4_000_000


def calibrate(model, make_input, steps=4):
    """BatchNorm statistics from random batches (cumulative averages), random weights
    for zero-initialized Linear layers, then eval."""
    import torch
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and not m.weight.detach().any():
            torch.nn.init.normal_(m.weight, std=0.02)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return model.eval()
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(steps):
            model(make_input())
    return model.eval()


def graphed(fn, x):
    """`fn(x)` captured in a CUDA graph on `x`'s buffer: (replay, output)."""
    import torch
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = fn(x)

    def replay():
        graph.replay()

    # The graph reads `fn`'s weights where they were at capture: they must live as long
    # as the replay (a module made only for the capture, as `fuse(model)`, would be
    # freed, and the replays read freed memory once the allocator gives it back).
    replay.module = fn
    return replay, out


def settle(name, run):
    """One run of side `name`, waited for, so that a fault of its kernels is reported as
    that side's and not as whichever call next touches the device."""
    import torch
    try:
        run()
        torch.cuda.synchronize()
    except (RuntimeError, getattr(torch, "AcceleratorError", RuntimeError)) as e:
        raise SideFailed(f"{name}: {str(e).splitlines()[0]}") from e


class SideFailed(Exception):
    """A configuration faulted on the GPU (the context is then lost for every side)."""


def time_once(run, spin):
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if spin:
        torch.cuda._sleep(SPIN_CYCLES)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0  # µs


def error(out, ref):
    """(max |out - ref|, that over max |ref|)."""
    diff = (out.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    return diff, diff / scale if scale else float("inf")


def markdown(result):
    lines = [f"# {result['model']} {result['dtype']} batch {result['batch']} "
             f"({result['layout']}) on {result['device']}", "",
             f"torch {result['torch']}, cuDNN {result['cudnn']}, CUDA {result['cuda']}; "
             f"{result['samples']} samples per configuration, median of one replay each; "
             f"deploy cache `{result['deploy']}`.", "",
             "| configuration | GPU µs (median) | p10 | p90 | vs eager | wall µs (median) | max error / max ref | setup s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    eager = result["configs"].get("eager", {}).get("median_us")
    for name in CONFIGS:
        c = result["configs"].get(name)
        if not c:
            continue
        vs = f"{eager / c['median_us']:.3f}x" if eager else ""
        lines.append(f"| {name} | {c['median_us']:.1f} | {c['p10_us']:.1f} | {c['p90_us']:.1f} | {vs} | "
                     f"{c['wall_median_us']:.1f} | {c['rel_error']:.2e} | {c['setup_s']:.1f} |")
    lines += ["", "Speedups (GPU time): " + ", ".join(f"{k} **{v:.3f}x**" for k, v in result["speedups"].items()),
              "", "Speedups (wall time): " + ", ".join(f"{k} {v:.3f}x" for k, v in result["wall_speedups"].items()), "",
              f"Error: against float32 eager on the same weights, over the largest reference value; "
              f"{result['dtype']} eager's own is {result['configs']['eager']['rel_error']:.2e}, the swapped "
              f"models may have {result['tolerance']:.2e}; eager+tilesched differs from {result['dtype']} eager "
              f"by {result['configs']['eager+tilesched']['vs_eager_error']:.2e}.", "",
              "Swapped (`tilesched.torch.optimize`):", "", "```", result["report"], "```"]
    return "\n".join(lines) + "\n"


def prepare(args, model, x, tt, torch):
    """Every configuration set up and run once on its own, in order: (runs, outputs,
    setup seconds, the optimized model). A GPU fault is raised as `SideFailed` naming
    the side it happened in."""
    runs, outputs, setup = {}, {}, {}

    def side(name, make):
        t0 = time.time()
        try:
            runs[name], outputs[name] = make()
        except (RuntimeError, getattr(torch, "AcceleratorError", RuntimeError)) as e:
            raise SideFailed(f"{name}: {str(e).splitlines()[0]}") from e
        settle(name, runs[name])
        setup[name] = time.time() - t0

    side("eager", lambda: graphed(model, x))
    optimized = tt.optimize(model, args.deploy, x)
    print(optimized.tilesched_report, file=sys.stderr)
    side("eager+tilesched", lambda: graphed(optimized, x))
    if any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()):
        from torch.fx.experimental.optimization import fuse
        side("eager+fold", lambda: graphed(fuse(model), x))
    if not args.no_compile:
        import copy
        import torch._inductor.config as inductor
        # No torch._dynamo.reset() between them: it would drop the first one's compiled
        # code and recompile it in the middle of the timing. The frozen side compiles a
        # copy of the model, so that no compiled code of the plain side serves it.
        sides = [("compile", model, False)] if "plain" in args.compile else []
        if "frozen" in args.compile:
            sides.append(("compile-frozen", copy.deepcopy(model), True))
        sides.append(("compile+tilesched", optimized, False))
        for name, m, frozen in sides:
            def make(m=m, frozen=frozen):
                compiled = torch.compile(m, mode="max-autotune")

                def run():
                    with torch.no_grad():
                        return compiled(x)

                # Inductor compiles on the first call and reads `freezing` then.
                with inductor.patch(freezing=frozen):
                    for _ in range(3):
                        run()
                return run, run().clone()

            side(name, make)
            print(f"{name}: compiled in {setup[name]:.0f} s", file=sys.stderr)
    return runs, outputs, setup, optimized


def main(argv=None):
    try:
        from tilesched.__main__ import add_model_arguments, load_model
    except ImportError as e:
        print(f"e2e.py: the tilesched package: {e}", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="e2e.py", description=__doc__.split("\n")[0])
    add_model_arguments(p, dtype="fp16")
    p.add_argument("--deploy", required=True, help="the deploy cache")
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--tolerance", type=float, default=1e-2)
    p.add_argument("--tolerance-factor", type=float, default=1.5)
    p.add_argument("--no-compile", action="store_true", help="eager sides only")
    p.add_argument("--compile", type=lambda v: v.split(","), default=["plain"],
                   help="the compiled baselines, comma-separated: plain (max-autotune), "
                        "frozen (max-autotune with Inductor's freezing)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not set(args.compile) <= {"plain", "frozen"}:
        p.error(f"--compile takes plain and frozen, not {','.join(args.compile)}")
    try:
        import torch
        import tilesched
        from tilesched import torch as tt
    except ImportError as e:
        print(f"e2e.py: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("e2e.py: no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    dtype = {"f32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    shape = [args.batch] + [int(v) for v in args.input_shape.split(",")]

    def make_input(dt=torch.float32):
        return torch.randn(shape, device="cuda").to(dt).contiguous(memory_format=fmt)

    model = load_model(args.model).cuda().to(memory_format=fmt)
    calibrate(model, make_input)
    reference_model = model  # float32
    x32 = make_input()
    with torch.no_grad():
        ref = reference_model(x32).float().clone()
    model = load_model(args.model)
    model.load_state_dict(reference_model.state_dict())
    model = model.eval().cuda().to(dtype=dtype, memory_format=fmt)
    x = x32.to(dtype).contiguous(memory_format=fmt)

    try:
        runs, outputs, setup, optimized = prepare(args, model, x, tt, torch)
    except tilesched.TileschedError as e:
        print(f"e2e.py: {e}", file=sys.stderr)
        return 2
    except SideFailed as e:
        print(f"e2e.py: the GPU faulted in side {e}", file=sys.stderr)
        return 1
    report = str(optimized.tilesched_report)
    try:
        for name, fn in runs.items():  # warm, each side waited for on its own
            for _ in range(20):
                fn()
            settle(name, fn)
    except SideFailed as e:
        print(f"e2e.py: the GPU faulted in side {e}", file=sys.stderr)
        return 1
    samples = {name: [] for name in runs}
    wall = {name: [] for name in runs}
    for _ in range(args.samples):
        for name, fn in runs.items():
            samples[name].append(time_once(fn, spin=True))
            torch.cuda.synchronize()
            wall[name].append(time_once(fn, spin=False))
    configs = {}
    ok = True
    eager_error = error(outputs["eager"], ref)[1]
    allowed = max(args.tolerance, args.tolerance_factor * eager_error)
    for name in runs:
        s = sorted(samples[name])
        abs_err, rel_err = error(outputs[name], ref)
        configs[name] = dict(median_us=statistics.median(s), p10_us=s[len(s) // 10],
                             p90_us=s[(len(s) * 9) // 10], wall_median_us=statistics.median(wall[name]),
                             abs_error=abs_err, rel_error=rel_err,
                             vs_eager_error=error(outputs[name], outputs["eager"])[1],
                             setup_s=setup[name])
        if "tilesched" in name and not rel_err <= allowed:
            ok = False
    pairs = [("eager+tilesched", "eager"), ("eager+tilesched", "eager+fold"),
             ("compile+tilesched", "compile"), ("compile+tilesched", "compile-frozen"),
             ("compile+tilesched", "eager")]
    pairs = [(a, b) for a, b in pairs if a in configs and b in configs]
    speedups = {f"{a} vs {b}": configs[b]["median_us"] / configs[a]["median_us"] for a, b in pairs}
    wall_speedups = {f"{a} vs {b}": configs[b]["wall_median_us"] / configs[a]["wall_median_us"]
                     for a, b in pairs}
    swapped = optimized.tilesched_report.swapped
    result = dict(
        model=args.model, batch=args.batch, dtype=args.dtype,
        layout="channels_last" if args.channels_last else "contiguous",
        device=torch.cuda.get_device_name(0), torch=torch.__version__,
        cudnn=torch.backends.cudnn.version(), cuda=torch.version.cuda, deploy=args.deploy,
        samples=args.samples, tolerance=allowed, configs=configs, speedups=speedups, wall_speedups=wall_speedups,
        swapped_layers=len(swapped), swapped_kernels=sum(len(k) for _, k in swapped),
        report=report, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        within_tolerance=ok)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = markdown(result)
    with open(os.path.join(args.out, "e2e.md"), "w") as f:
        f.write(md)
    print(md)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
