"""The model rewrite against eager PyTorch, on the CPU.

The kernel launch is replaced by a reference (PyTorch's own convolution and matmul on
the kernel's operands, in the kernel's layouts), so that what is tested is the rewrite:
tracing, matching, BatchNorm folding, weight layouts, the operators' checks and the
graph surgery. Needs torch (and torchvision for the ViT case); skipped without it, run
on the GPU machine by `scripts/device-check python`.
"""

import os
import sys
import tempfile
import unittest

# The source tree, after an installed package (PYTHONPATH) where there is one.
sys.path.append(os.path.join(os.path.dirname(__file__), ".."))

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # pragma: no cover - the CI machine has no torch
    torch = None

try:
    import torchvision
except ImportError:
    torchvision = None


class FakeCache:
    """A deploy cache holding the kernels of `keys`."""

    def __init__(self, keys):
        self.dir, self.keys = "/fake", sorted(keys)

    def tasks(self):
        return self.keys

    def kernel(self, key):
        raise RuntimeError(f"task {key} was tuned for NVIDIA H100 80GB HBM3 (sm_90), not for this GPU")


def reference_run(op, x, weight, bias, cache, key):
    """What the kernel computes, by PyTorch, after the operator's own checks."""
    from tilesched import ops
    task = ops.task_of(key, op)
    ops._check_operands(op, task, key, x, weight, bias)  # all but the device: on the CPU
    if op == "conv2d":
        d = task.d
        w = weight.permute(0, 3, 1, 2) if task.layout == "nhwc" else weight
        out = F.conv2d(x.float(), w.float(), None if bias is None else bias.float(),
                       (d["stride_h"], d["stride_w"]), (d["pad_h"], d["pad_w"]),
                       (d["dilation_h"], d["dilation_w"]), d["groups"])
    else:
        out = torch.matmul(x.float(), weight.float())
        if bias is not None:
            out = out + bias.float()
    if task.relu:
        out = out.relu()
    fmt = torch.channels_last if op == "conv2d" and task.layout == "nhwc" else torch.contiguous_format
    return out.to(ops.TORCH_DTYPES[task.out_dtype]).contiguous(memory_format=fmt)


@unittest.skipIf(torch is None, "needs torch")
class Rewrite(unittest.TestCase):
    def setUp(self):
        import tilesched.ops as ops
        import tilesched.torch as tt
        self.tt = tt
        self.saved = (ops._run, tt.open_cache)
        ops._run = reference_run
        tt.open_cache = lambda path, device: self.cache
        self.cache = None

    def tearDown(self):
        import tilesched.ops as ops
        ops._run, self.tt.open_cache = self.saved

    def optimize(self, model, x, keys=None):
        """`model` optimized with a cache of `keys` (default: all of its tasks)."""
        if keys is None:
            keys = [t.key() for t, _ in self.tt.tasks(model, x)]
        self.cache = FakeCache(keys)
        return self.tt.optimize(model, "/fake", x, device="cuda:0")

    def small_net(self):
        torch.manual_seed(0)

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
                self.bn1 = nn.BatchNorm2d(16)
                self.relu = nn.ReLU(inplace=True)
                self.conv2 = nn.Conv2d(16, 8, 1, stride=2)
                self.bn2 = nn.BatchNorm2d(8)
                self.down = nn.Conv2d(8, 8, 1, stride=2, bias=False)
                self.fc = nn.Linear(8, 5)

            def forward(self, x):
                y = self.relu(self.bn1(self.conv1(x)))
                y = self.bn2(self.conv2(y))
                y = self.relu(y + self.down(x))
                return F.relu(self.fc(y.mean((2, 3))))

        net = Block()
        for bn in (net.bn1, net.bn2):  # statistics that make folding matter
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)
        return net.eval()

    def test_a_small_net_matches_eager_in_both_layouts(self):
        for fmt, layout in ((torch.contiguous_format, "nchw"), (torch.channels_last, "nhwc")):
            net = self.small_net()
            x = torch.randn(2, 8, 10, 10).contiguous(memory_format=fmt)
            want = net(x)
            gm = self.optimize(net, x)
            report = gm.tilesched_report
            self.assertEqual(sorted(label for label, _ in report.swapped),
                             ["conv2d", "conv2d+batchnorm", "conv2d+batchnorm+relu", "linear+relu"])
            keys = [k for _, ks in report.swapped for k in ks]
            self.assertIn(f"conv2d_n2_c8_h10_w10_k16_r3_s3_st1_p1_bias_relu_{layout}"
                          if layout == "nhwc" else "conv2d_n2_c8_h10_w10_k16_r3_s3_st1_p1_bias_relu",
                          keys)
            self.assertIn("matmul_m2_n5_k8_bias_relu", keys)
            self.assertIn("not tuned: 1 ReLU, 1 add, 1 mean", str(report))
            self.assertFalse(any(isinstance(m, nn.BatchNorm2d) for m in gm.modules()))
            torch.testing.assert_close(gm(x), want, rtol=1e-4, atol=1e-5)
            # Specialized to the example's shape: another is refused in one line.
            with self.assertRaises(ValueError) as e:
                gm(torch.randn(3, 8, 10, 10).contiguous(memory_format=fmt))
            self.assertIn("has shape [3, 8, 10, 10], the kernel takes [2, 8, 10, 10]", str(e.exception))

    def test_only_what_the_cache_holds_is_swapped(self):
        net = self.small_net()
        x = torch.randn(2, 8, 10, 10)
        gm = self.optimize(net, x, ["matmul_m2_n5_k8_bias_relu"])
        self.assertEqual(gm.tilesched_report.swapped, [("linear+relu", ["matmul_m2_n5_k8_bias_relu"])])
        self.assertIn("left to PyTorch (no kernel in the deploy cache): 1 conv2d, 1 conv2d+batchnorm, 1 conv2d+batchnorm+relu",
                      str(gm.tilesched_report))
        torch.testing.assert_close(gm(x), net(x), rtol=1e-4, atol=1e-5)

    def test_training_mode_and_a_foreign_cache_are_refused(self):
        from tilesched import TileschedError
        with self.assertRaises(TileschedError) as e:
            self.optimize(self.small_net().train(), torch.randn(2, 8, 10, 10), [])
        self.assertIn("call model.eval() first", str(e.exception))
        with self.assertRaises(TileschedError) as e:
            self.optimize(self.small_net(), torch.randn(2, 8, 10, 10), ["matmul_m1_n1_k1"])
        self.assertEqual(len(str(e.exception).splitlines()), 1)
        self.assertIn("tuned for NVIDIA H100 80GB HBM3 (sm_90), not for this GPU", str(e.exception))

    def test_task_list_of_a_model(self):
        net = self.small_net()
        x = torch.randn(2, 8, 10, 10).contiguous(memory_format=torch.channels_last)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.jsonl")
            pairs = self.tt.write_tasks(net, x, path)
            from tilesched.keys import read_task_list
            self.assertEqual(read_task_list(path), pairs)
        self.assertEqual([t.key() for t, _ in pairs], [
            "conv2d_n2_c8_h10_w10_k16_r3_s3_st1_p1_bias_relu_nhwc",
            "conv2d_n2_c16_h10_w10_k8_r1_s1_st2_p0_bias_nhwc",
            "conv2d_n2_c8_h10_w10_k8_r1_s1_st2_p0_nhwc",
            "matmul_m2_n5_k8_bias_relu"])

    @unittest.skipIf(torchvision is None, "needs torchvision")
    def test_resnet50_and_vit(self):
        torch.manual_seed(0)
        net = torchvision.models.resnet50().eval()
        x = torch.randn(1, 3, 64, 64).contiguous(memory_format=torch.channels_last)
        gm = self.optimize(net, x)
        report = gm.tilesched_report
        self.assertEqual(len(report.swapped), 54, str(report))  # 53 convolutions and fc
        self.assertEqual(sum(1 for label, _ in report.swapped if label == "conv2d+batchnorm+relu"), 33)
        torch.testing.assert_close(gm(x), net(x), rtol=1e-3, atol=1e-3)
        pairs = self.tt.tasks(net, x)
        self.assertEqual(sum(c for t, c in pairs if t.op == "conv2d"), 53)

        vit = torchvision.models.vit_b_16(image_size=32).eval()
        x = torch.randn(2, 3, 32, 32)
        gm = self.optimize(vit, x)
        labels = [label for label, _ in gm.tilesched_report.swapped]
        self.assertEqual(labels.count("attention"), 12)
        self.assertEqual(labels.count("linear"), 25)  # 12 blocks x 2 MLP layers, the head
        keys = {k for _, ks in gm.tilesched_report.swapped for k in ks}
        self.assertIn("matmul_m10_n2304_k768_bias", keys)
        torch.testing.assert_close(gm(x), vit(x), rtol=1e-3, atol=1e-3)


if __name__ == "__main__":
    unittest.main()
