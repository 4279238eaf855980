"""The operators on the GPU, against PyTorch, exactly (run by `scripts/device-check python`).

Needs torch with CUDA, the built package (`tilesched._native`) and a deploy cache for
this GPU in TILESCHED_TEST_DEPLOY (directories, comma-separated); skipped otherwise.

Inputs are exact in every type involved: ±1 and 0, with at most 2046 non-zero weights
per output, so every partial sum is an integer below 2048 in magnitude whatever the
order of the additions; the output must then equal PyTorch's float64 result bit for bit.
"""

import json
import os
import shutil
import sys
import tempfile
import unittest

# The source tree, after an installed package (PYTHONPATH) where there is one.
sys.path.append(os.path.join(os.path.dirname(__file__), ".."))

try:
    import torch
    import torch.nn.functional as F
    CUDA = torch.cuda.is_available()
except ImportError:
    CUDA = False

CACHES = [d for d in os.environ.get("TILESCHED_TEST_DEPLOY", "").split(",") if d]
# Kernels checked per cache (the largest tasks take the longest to build a reference for).
MAX_KERNELS = int(os.environ.get("TILESCHED_TEST_KERNELS", "64"))


def exact_operands(task, seed):
    """(x, weight, bias) for `task` on the GPU, exact as the module's doc says."""
    from tilesched import ops
    g = torch.Generator(device="cpu").manual_seed(seed)
    dtype = ops.TORCH_DTYPES[task.dtype]
    data_shape, weight_shape, bias_shape = ops.expected_shapes(task)
    x = torch.randint(-1, 2, data_shape, generator=g).float()
    w = torch.randint(-1, 2, weight_shape, generator=g).float()
    # Sparse weights: per output, at most 2046 non-zeros over its reduction.
    if task.op == "conv2d":
        per_out = w.reshape(w.shape[0], -1)
        outputs = per_out.shape[0]
        red = per_out.shape[1]
    else:
        per_out = w.transpose(-1, -2).reshape(-1, w.shape[-2])  # one row per output column
        outputs, red = per_out.shape
    if red > 2046:
        keep = torch.zeros_like(per_out)
        idx = torch.stack([torch.randperm(red, generator=g)[:2046] for _ in range(outputs)])
        keep.scatter_(1, idx, 1.0)
        per_out = per_out * keep
        if task.op == "conv2d":
            w = per_out.reshape(w.shape)
        else:
            w = per_out.reshape(*w.shape[:-2], w.shape[-1], w.shape[-2]).transpose(-1, -2)
    b = torch.randint(-1, 2, bias_shape, generator=g).float() if task.bias else None
    fmt = torch.channels_last if task.op == "conv2d" and task.layout == "nhwc" else torch.contiguous_format
    to = lambda t, f=torch.contiguous_format: t.to("cuda", dtype).contiguous(memory_format=f)  # noqa: E731
    return to(x, fmt), to(w.contiguous()), (to(b) if b is not None else None)


def reference(task, x, w, b):
    """PyTorch in float64, in the output type."""
    from tilesched import ops
    d = task.d
    if task.op == "conv2d":
        wk = w.permute(0, 3, 1, 2) if task.layout == "nhwc" else w
        out = F.conv2d(x.double(), wk.double(), None if b is None else b.double(),
                       (d["stride_h"], d["stride_w"]), (d["pad_h"], d["pad_w"]),
                       (d["dilation_h"], d["dilation_w"]), d["groups"])
    else:
        out = torch.matmul(x.double(), w.double())
        if b is not None:
            out = out + b.double()
    if task.relu:
        out = out.relu()
    return out.to(ops.TORCH_DTYPES[task.out_dtype])


def call(task, cache, x, w, b):
    op = {"conv2d": torch.ops.tilesched.conv2d, "matmul": torch.ops.tilesched.matmul,
          "batch_matmul": torch.ops.tilesched.batch_matmul}[task.op]
    return op(x, w, b, cache, task.key())


@unittest.skipUnless(CUDA and CACHES, "needs a GPU and TILESCHED_TEST_DEPLOY")
class Operators(unittest.TestCase):
    def setUp(self):
        import tilesched
        from tilesched import ops  # noqa: F401  (registers the operators)
        self.tilesched = tilesched

    def keys(self, cache):
        return self.tilesched.open_cache(cache, 0).tasks()[:MAX_KERNELS]

    def test_every_kernel_is_exact(self):
        from tilesched.keys import parse_key
        checked = 0
        for cache in CACHES:
            for key in self.keys(cache):
                task = parse_key(key)
                x, w, b = exact_operands(task, seed=checked)
                got = call(task, os.path.realpath(cache), x, w, b)
                want = reference(task, x, w, b)
                with self.subTest(key=key):
                    self.assertEqual(got.shape, want.shape)
                    self.assertEqual(got.stride(), want.contiguous(
                        memory_format=torch.channels_last if got.dim() == 4 and task.layout == "nhwc"
                        else torch.contiguous_format).stride())
                    self.assertTrue(torch.equal(got, want),
                                    f"{key}: {(got.double() - want.double()).abs().max().item()} off")
                checked += 1
        print(f"\n{checked} kernels exact against PyTorch float64", file=sys.stderr)
        self.assertGreater(checked, 0)

    def first(self, op):
        from tilesched.keys import parse_key
        for cache in CACHES:
            for key in self.keys(cache):
                if parse_key(key).op == op:
                    return os.path.realpath(cache), parse_key(key)
        self.skipTest(f"no {op} kernel in the caches")

    def test_capture_in_a_cuda_graph(self):
        for op in ("conv2d", "matmul"):
            cache, task = self.first(op)
            x, w, b = exact_operands(task, seed=1)
            call(task, cache, x, w, b)  # loads the kernel outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = call(task, cache, x, w, b)
            x2, _, _ = exact_operands(task, seed=2)
            x.copy_(x2)
            graph.replay()
            torch.cuda.synchronize()
            self.assertTrue(torch.equal(out, reference(task, x2, w, b)), task.key())

    def test_inside_a_compiled_graph(self):
        for op in ("conv2d", "matmul"):
            cache, task = self.first(op)
            x, w, b = exact_operands(task, seed=3)
            op = getattr(torch.ops.tilesched, task.op)
            key = task.key()

            def f(x, w, b):
                return op(x * 1, w, b, cache, key) * 2

            compiled = torch.compile(f, fullgraph=True)
            self.assertTrue(torch.equal(compiled(x, w, b), reference(task, x, w, b) * 2), task.key())

    def test_bad_input_is_one_line(self):
        from tilesched import TileschedError
        from tilesched.ops import InputError
        cache, task = self.first("conv2d")
        x, w, b = exact_operands(task, seed=4)
        wrong = []
        if task.layout == "nhwc":
            wrong.append((x.contiguous(), "is not channels_last"))
        wrong += [(x.cpu(), "input is on cpu"), (x.float(), "the kernel takes torch.float16"
                                                 if task.dtype == "fp16" else "the kernel takes"),
                  (x[:, :, :-1], "has shape")]
        for bad, expect in wrong:
            with self.assertRaises((InputError, TileschedError)) as e:
                call(task, cache, bad, w, b)
            self.assertIn(expect, str(e.exception))
            self.assertEqual(len(str(e.exception).splitlines()), 1)
        # A cache for another GPU, and no cache at all.
        with tempfile.TemporaryDirectory() as tmp:
            foreign = os.path.join(tmp, "foreign")
            shutil.copytree(cache, foreign)
            index = os.path.join(foreign, "index.json")
            with open(index) as f:
                text = f.read()
            with open(index, "w") as f:
                f.write(text.replace(torch.cuda.get_device_name(0), "NVIDIA A100-SXM4-80GB"))
            with self.assertRaises(TileschedError) as e:
                call(task, foreign, x, w, b)
            self.assertIn("not for this GPU", str(e.exception))
            self.assertEqual(len(str(e.exception).splitlines()), 1)
            with self.assertRaises(TileschedError) as e:
                call(task, os.path.join(tmp, "missing"), x, w, b)
            self.assertIn("no deploy cache at", str(e.exception))

    def test_misaligned_storage_is_refused(self):
        cache, task = self.first("matmul")
        x, w, b = exact_operands(task, seed=5)
        from tilesched import TileschedError
        flat = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
        shifted = flat[1:].view(x.shape)  # contiguous, 2 bytes past an aligned start
        shifted.copy_(x)
        with self.assertRaises(TileschedError) as e:
            call(task, cache, shifted, w, b)
        self.assertIn("not aligned to 16 bytes", str(e.exception))


if __name__ == "__main__":
    unittest.main()
