"""Tests of torch_peer.py's pure parts, and of its refusals, on a machine without torch.

    python3 -m unittest benchmarks/peer/test_torch_peer.py      (from the repository root)

The GPU parts (loading cubins, timing, the exact check) need torch and a GPU and are
not exercised here.
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer.py")


def _load_module():
    spec = importlib.util.spec_from_file_location("torch_peer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch_peer"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


torch_already_imported = "torch" in sys.modules
tp = _load_module()

H100 = "NVIDIA H100 80GB HBM3"


def conv(n, c, h, w, k, r, s, stride, pad, **extra):
    """A conv2d Task JSON in the positional form of the command line."""
    obj = {"op": "conv2d", "n": n, "c": c, "h": h, "w": w, "k": k, "r": r, "s": s,
           "stride_h": stride, "stride_w": stride, "pad_h": pad, "pad_w": pad,
           "dilation_h": 1, "dilation_w": 1}
    obj.update(extra)
    return obj


def run_script(args, env=None):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True,
                          env=env, timeout=120)


class TaskParsing(unittest.TestCase):
    def test_defaults_of_an_old_conv_record(self):
        t = tp.parse_task(conv(1, 64, 56, 56, 64, 3, 3, 1, 1))
        self.assertEqual((t.dtype, t.out_dtype, t.layout, t.groups), ("f32", "f32", "nchw", 1))
        self.assertEqual((t.bias, t.relu, t.pad_bottom, t.pad_right), (False, False, None, None))
        self.assertEqual(t.c, 64)

    def test_full_record(self):
        t = tp.parse_task(conv(2, 64, 56, 56, 128, 3, 3, 1, 1, epilogue={"bias": True,
                                                                           "relu": False},
                               dtype="fp16", out_dtype="f32", layout="nhwc"))
        self.assertEqual((t.dtype, t.out_dtype, t.layout, t.bias, t.relu),
                         ("fp16", "f32", "nhwc", True, False))
        mm = tp.parse_task({"op": "batch_matmul", "b": 4, "m": 8, "n": 16, "k": 32,
                            "epilogue": {"bias": False, "relu": True}, "dtype": "bf16",
                            "out_dtype": "bf16"})
        self.assertEqual((mm.op, mm.b, mm.m, mm.n, mm.k, mm.relu), ("batch_matmul", 4, 8, 16,
                                                                     32, True))

    def test_malformed_tasks_are_refused(self):
        bad = [
            ({"op": "conv3d"}, "unknown op"),
            ({"op": "matmul", "m": 8, "n": 8}, "'k'"),
            ({"op": "matmul", "m": 0, "n": 8, "k": 8}, "at least 1"),
            ({"op": "matmul", "m": 8, "n": 8, "k": 8, "dtype": "fp16", "out_dtype": "bf16"},
             "output type"),
            ({"op": "matmul", "m": 8, "n": 8, "k": 8, "layout": "nhwc"}, "conv2d only"),
            (conv(1, 6, 8, 8, 8, 3, 3, 1, 1, groups=4), "groups 4 must divide"),
            (conv(1, 1, 2, 2, 1, 3, 3, 1, 0), "empty"),
            (conv(1, 1, 8, 8, 1, 3, 3, 1, 1, dtype="fp8"), "dtype"),
        ]
        for obj, words in bad:
            with self.assertRaises(tp.TaskError) as caught:
                tp.parse_task(obj)
            self.assertIn(words, str(caught.exception))

    def test_keys_match_the_rust_keys(self):
        # Keys from schedule/src/task.rs's tests.
        cases = [
            (conv(1, 512, 7, 7, 512, 3, 3, 1, 1), "conv2d_n1_c512_h7_w7_k512_r3_s3_st1_p1"),
            (conv(2, 64, 56, 56, 128, 3, 3, 1, 1, dtype="fp16", out_dtype="fp16",
                  layout="nhwc"),
             "conv2d_n2_c64_h56_w56_k128_r3_s3_st1_p1_fp16_out_fp16_nhwc"),
            (conv(1, 32, 112, 112, 32, 3, 3, 1, 1, groups=32),
             "conv2d_n1_c32_h112_w112_k32_r3_s3_st1_p1_g32"),
            (conv(1, 8, 8, 8, 8, 3, 3, 2, 0, pad_bottom=1, pad_right=1),
             "conv2d_n1_c8_h8_w8_k8_r3_s3_st2_p0_pe1"),
            ({"op": "matmul", "m": 333, "n": 777, "k": 555,
              "epilogue": {"bias": True, "relu": True}}, "matmul_m333_n777_k555_bias_relu"),
            ({"op": "matmul", "m": 8, "n": 8, "k": 8, "dtype": "fp16"}, "matmul_m8_n8_k8_fp16"),
            (dict(conv(1, 3, 224, 224, 64, 7, 7, 2, 3), stride_w=1, pad_w=2, dilation_h=2,
                  pad_right=5, dtype="bf16"),
             "conv2d_n1_c3_h224_w224_k64_r7_s7_st2x1_p3x2_pe3x5_d2x1_bf16"),
            ({"op": "batch_matmul", "b": 12, "m": 128, "n": 64, "k": 128},
             "batch_matmul_b12_m128_n64_k128"),
        ]
        for obj, key in cases:
            self.assertEqual(tp.task_key(tp.parse_task(obj)), key)


class Shapes(unittest.TestCase):
    def test_conv_output_size(self):
        self.assertEqual(tp.conv_output_size(tp.parse_task(conv(1, 3, 224, 224, 64, 7, 7, 2,
                                                                 3))), (112, 112))
        # SAME_UPPER at stride 2 on an even input pads only the bottom and right.
        same = tp.parse_task(conv(1, 8, 8, 8, 8, 3, 3, 2, 0, pad_bottom=1, pad_right=1))
        self.assertEqual(tp.conv_output_size(same), (4, 4))
        self.assertTrue(tp.asymmetric_padding(same))
        dilated = tp.parse_task(dict(conv(1, 8, 16, 16, 8, 3, 3, 1, 0), dilation_h=2))
        self.assertEqual(tp.conv_output_size(dilated), (12, 14))
        self.assertFalse(tp.asymmetric_padding(dilated))

    def test_buffers_follow_the_kernel_parameters(self):
        # runtime/src/lib.rs params_follow_the_task: input, weight, bias, output.
        t = tp.parse_task(conv(1, 64, 56, 56, 128, 3, 3, 2, 1, epilogue={"bias": True,
                                                                           "relu": False}))
        specs = tp.buffer_specs(t)
        self.assertEqual([(s.role, s.elements, s.dtype) for s in specs],
                         [("input", 200704, "f32"), ("weight", 73728, "f32"),
                          ("bias", 128, "f32"), ("output", 100352, "f32")])
        self.assertEqual(specs[3].bytes, 100352 * 4)
        self.assertEqual(tp.flops(t), 2 * 128 * 28 * 28 * 64 * 9)

    def test_nhwc_storage_is_channels_last(self):
        t = tp.parse_task(conv(2, 64, 56, 56, 128, 3, 3, 1, 1, dtype="fp16", out_dtype="f32",
                               layout="nhwc", epilogue={"bias": True, "relu": True}))
        x, w, b, y = tp.buffer_specs(t)
        self.assertEqual(x.logical_shape, (2, 64, 56, 56))
        self.assertEqual(x.storage_shape, (2, 56, 56, 64))
        self.assertEqual(w.storage_shape, (128, 3, 3, 64))  # KRSC
        self.assertEqual(y.storage_shape, (2, 56, 56, 128))
        self.assertEqual((x.dtype, w.dtype, b.dtype, y.dtype), ("fp16", "fp16", "fp16", "f32"))
        self.assertEqual((x.bytes, y.bytes), (2 * 64 * 56 * 56 * 2, 2 * 128 * 56 * 56 * 4))
        self.assertFalse(b.channels_last)
        self.assertEqual(tp.set_bytes(t), x.bytes + w.bytes + b.bytes + y.bytes)

    def test_grouped_weights(self):
        t = tp.parse_task(conv(1, 32, 112, 112, 32, 3, 3, 1, 1, groups=32))
        self.assertEqual(tp.buffer_specs(t)[1].logical_shape, (32, 1, 3, 3))
        self.assertEqual(tp.reduction_length(t), 9)

    def test_matmul_shapes(self):
        mm = tp.parse_task({"op": "matmul", "m": 3, "n": 5, "k": 7,
                            "epilogue": {"bias": True, "relu": False}})
        self.assertEqual([s.logical_shape for s in tp.buffer_specs(mm)],
                         [(3, 7), (7, 5), (5,), (3, 5)])
        bmm = tp.parse_task({"op": "batch_matmul", "b": 2, "m": 3, "n": 5, "k": 7,
                             "epilogue": {"bias": True, "relu": False}})
        self.assertEqual([s.logical_shape for s in tp.buffer_specs(bmm)],
                         [(2, 3, 7), (2, 7, 5), (5,), (2, 3, 5)])
        self.assertEqual(tp.flops(bmm), 2 * 2 * 3 * 5 * 7)


def box(dtype, dims, strides, boxed, swizzle):
    """A TensorBox JSON object as serde writes it."""
    return {"dtype": dtype, "dims": dims, "strides": strides, "boxed": boxed,
            "swizzle": swizzle}


# A of a 4096³ fp16 matmul, K-major: 128 rows by 64 of K, one 128-byte swizzled row
# (TensorBox::matrix(Fp16, 4096, 4096, 4096, 1, 0, 128, 64, Swizzle::B128)).
A_FP16 = box("fp16", [4096, 4096], [8192], [64, 128], "b128")
# A batched bf16 operand: 8 matrices of 512 rows of 256 (TensorBox::matrix(Bf16, 512,
# 256, 256, 8, 512 * 256, 64, 64, Swizzle::B128)).
A_BF16_BATCHED = box("bf16", [256, 512, 8], [512, 512 * 256 * 2], [64, 64, 1], "b128")


# The activations of a 3×3 padding-1 stride-2 fp16 convolution over 2 images of 28×28
# with 64 channels, read by im2col in boxes of 128 pixels of 64 channels
# (schedule::wgmma::Im2colView's map: lower -1; the last output's base -1 + 13·2 = 25,
# so upper 25 - 27 = -2; traversal 2).
A_IM2COL = dict(box("fp16", [64, 28, 28, 2], [128, 128 * 28, 128 * 28 * 28], [64, 128],
                    "b128"), im2col={"lower": [-1, -1], "upper": [-2, -2],
                                     "traversal": [2, 2]})


class TensorMaps(unittest.TestCase):
    ADDRESS = 0x7F00_0000_0200

    def test_an_im2col_box(self):
        self.assertEqual(
            tp.tensor_map_im2col_encode_args(A_IM2COL, self.ADDRESS),
            (6, 4, self.ADDRESS, (64, 28, 28, 2), (128, 3584, 100352), (-1, -1), (-2, -2),
             64, 128, (1, 2, 2, 1), 0, 3, 2, 0))
        # A tiled box is not an im2col one; corners past 8 bits at rank 4, a traversal
        # past 8, a box of other than channels and pixels, or a rank below 3 are refused.
        with self.assertRaises(ValueError):
            tp.tensor_map_im2col_encode_args(A_FP16, self.ADDRESS)
        for change in ({"im2col": {"lower": [-129, -1], "upper": [-2, -2],
                                   "traversal": [2, 2]}},
                       {"im2col": {"lower": [-1, -1], "upper": [-2, -2], "traversal": [9, 2]}},
                       {"boxed": [64, 128, 1]},
                       {"dims": [64, 28], "strides": [128]}):
            with self.assertRaises(ValueError, msg=str(change)):
                tp.parse_tensor_box(A_IM2COL | change)

    def test_a_2d_fp16_k_major_box(self):
        (dtype, rank, address, dims, strides, boxed, element_strides, interleave, swizzle,
         l2_promotion, oob_fill) = tp.tensor_map_encode_args(A_FP16, self.ADDRESS)
        self.assertEqual(dtype, 6)  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        self.assertEqual(rank, 2)
        self.assertEqual(address, self.ADDRESS)
        self.assertEqual(dims, (4096, 4096))
        self.assertEqual(strides, (8192,))
        self.assertEqual(boxed, (64, 128))
        self.assertEqual(element_strides, (1, 1))
        self.assertEqual(interleave, 0)  # CU_TENSOR_MAP_INTERLEAVE_NONE
        self.assertEqual(swizzle, 3)  # CU_TENSOR_MAP_SWIZZLE_128B
        self.assertEqual(l2_promotion, 2)  # CU_TENSOR_MAP_L2_PROMOTION_L2_128B
        self.assertEqual(oob_fill, 0)  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE

    def test_a_3d_batched_bf16_box(self):
        self.assertEqual(tp.tensor_map_encode_args(A_BF16_BATCHED, self.ADDRESS),
                         (9, 3, self.ADDRESS, (256, 512, 8), (512, 262144), (64, 64, 1),
                          (1, 1, 1), 0, 3, 2, 0))

    def test_every_type_and_swizzle(self):
        for dtype, code in (("f32", 7), ("tf32", 11), ("fp16", 6), ("bf16", 9)):
            args = tp.tensor_map_encode_args(box(dtype, [64], [], [8], "none"), 256)
            self.assertEqual((args[0], args[1], args[4], args[8]), (code, 1, (), 0))
        for swizzle, code, width in (("none", 0, 256), ("b32", 1, 16), ("b64", 2, 32),
                                     ("b128", 3, 64)):
            args = tp.tensor_map_encode_args(box("fp16", [256, 4], [512], [width, 4],
                                                 swizzle), 256)
            self.assertEqual(args[8], code)

    def test_boxes_that_break_the_rules_are_refused(self):
        bad = {
            "rank": box("fp16", [], [], [], "none"),
            "six dimensions": box("fp16", [8] * 6, [16] * 5, [8] * 6, "none"),
            "one stride too many": box("fp16", [64, 64], [128, 128], [64, 64], "none"),
            "box length": box("fp16", [64, 64], [128], [64], "none"),
            "stride not a multiple of 16": box("fp16", [555, 333], [1110], [64, 64], "b128"),
            "stride 2^40": box("fp16", [64, 64], [1 << 40], [64, 64], "none"),
            "zero extent": box("fp16", [0, 64], [128], [64, 64], "none"),
            "extent above 2^32": box("fp16", [64, (1 << 32) + 1], [128], [64, 64], "none"),
            "box above 256": box("fp16", [4096, 4096], [8192], [64, 512], "none"),
            "zero box": box("fp16", [4096, 4096], [8192], [64, 0], "none"),
            "inner box not 16 bytes": box("fp16", [4096, 4096], [8192], [4, 64], "none"),
            "inner box wider than its swizzle": box("fp16", [4096, 4096], [8192],
                                                    [128, 64], "b128"),
            "dtype": box("fp8", [64], [], [16], "none"),
            "swizzle": box("fp16", [64], [], [8], "128B"),
            "negative": box("fp16", [-64], [], [8], "none"),
            "boolean": box("fp16", [True], [], [8], "none"),
            "not a list": box("fp16", 64, [], [8], "none"),
            "not an object": [64],
        }
        for name, tensor in bad.items():
            with self.subTest(name), self.assertRaises(ValueError):
                tp.tensor_map_encode_args(tensor, self.ADDRESS)
        for address in (0, self.ADDRESS + 8, -256, None):
            with self.subTest(address=address), self.assertRaises(ValueError):
                tp.tensor_map_encode_args(A_FP16, address)

    def test_tensor_maps_name_buffers_of_the_kernel(self):
        maps = tp.parse_tensor_maps([{"buffer": 1, "tensor": A_BF16_BATCHED},
                                     {"buffer": 0, "tensor": A_FP16}], 3, "here")
        self.assertEqual([m.buffer for m in maps], [1, 0])
        self.assertEqual(maps[1].tensor["boxed"], (64, 128))
        self.assertEqual(tp.parse_tensor_maps(None, 3, "here"), ())
        for value in ({"buffer": 0, "tensor": A_FP16}, [{"buffer": 3, "tensor": A_FP16}],
                      [{"buffer": -1, "tensor": A_FP16}], [{"buffer": "0", "tensor": A_FP16}],
                      [{"buffer": 0}], [A_FP16]):
            with self.subTest(value=value), self.assertRaises(ValueError):
                tp.parse_tensor_maps(value, 3, "here")


class LaunchKernelEx(unittest.TestCase):
    """cuLaunchKernelEx's structures, laid out as cuda.h (CUDA 12, 13) declares them on
    a 64-bit host, and the config built for a clustered launch."""

    def test_structure_layout(self):
        import ctypes
        self.assertEqual(ctypes.sizeof(tp.CUlaunchAttributeValue), 64)
        self.assertEqual(ctypes.alignment(tp.CUlaunchAttributeValue), 8)
        self.assertEqual(tp.CUlaunchAttributeValue.clusterDim.offset, 0)
        dim = tp.CUlaunchAttributeClusterDim
        self.assertEqual((dim.x.offset, dim.y.offset, dim.z.offset, ctypes.sizeof(dim)),
                         (0, 4, 8, 12))
        self.assertEqual(ctypes.sizeof(tp.CUlaunchAttribute), 72)
        self.assertEqual((tp.CUlaunchAttribute.id.offset, tp.CUlaunchAttribute.id.size),
                         (0, 4))
        self.assertEqual(tp.CUlaunchAttribute.value.offset, 8)
        config = tp.CUlaunchConfig
        self.assertEqual(ctypes.sizeof(config), 56)
        self.assertEqual([getattr(config, name).offset for name in (
            "gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ",
            "sharedMemBytes")], [0, 4, 8, 12, 16, 20, 24])
        self.assertEqual((config.hStream.offset, config.attrs.offset,
                          config.numAttrs.offset), (32, 40, 48))
        self.assertEqual(tp.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, 4)

    def test_config_of_a_clustered_launch(self):
        import ctypes
        launch = tp.Launch((8, 6, 4), (384, 1, 1), 200 * 1024, False, cluster=(2, 3, 1))
        config, attribute = tp.launch_config(launch, 0x1234)
        self.assertEqual((config.gridDimX, config.gridDimY, config.gridDimZ,
                          config.blockDimX, config.blockDimY, config.blockDimZ,
                          config.sharedMemBytes, config.hStream, config.numAttrs),
                         (8, 6, 4, 384, 1, 1, 200 * 1024, 0x1234, 1))
        self.assertEqual(ctypes.addressof(config.attrs.contents), ctypes.addressof(attribute))
        self.assertEqual(attribute.id, tp.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        raw = bytes(attribute)
        self.assertEqual(raw[:4], (4).to_bytes(4, sys.byteorder))
        self.assertEqual(raw[8:20], b"".join(v.to_bytes(4, sys.byteorder) for v in (2, 3, 1)))
        self.assertEqual(raw[20:], bytes(52))
        config, _ = tp.launch_config(launch, 0)  # the legacy default stream
        self.assertIsNone(config.hStream)

    def test_no_cluster_by_default(self):
        self.assertEqual(tp.Launch((4, 1, 1), (128, 1, 1), 0, False).cluster, (1, 1, 1))


class ExactValues(unittest.TestCase):
    def check(self, plan, reduction, bias):
        terms = plan.weight_nonzeros if plan.weight_nonzeros is not None else reduction
        bound = terms * plan.magnitude ** 2 + (plan.magnitude if bias else 0)
        self.assertEqual(plan.worst_case, bound)
        self.assertLess(plan.worst_case, plan.limit)

    def test_dense_small_integers_where_they_fit(self):
        plan = tp.value_plan(576, "f32", "f32", True)
        self.assertEqual((plan.magnitude, plan.weight_nonzeros, plan.limit), (2, None, 1 << 24))
        self.check(plan, 576, True)
        self.assertEqual(tp.value_plan(576, "tf32", "f32", False).magnitude, 2)
        # fp16: 576 * 4 + 2 would reach 2048, so values in {-1, 0, 1}.
        plan = tp.value_plan(576, "fp16", "fp16", True)
        self.assertEqual((plan.magnitude, plan.weight_nonzeros, plan.worst_case), (1, None, 577))
        self.assertEqual(tp.value_plan(511, "fp16", "fp16", False).magnitude, 2)
        self.assertEqual(tp.value_plan(512, "fp16", "fp16", False).magnitude, 1)

    def test_half_inputs_bound_the_sums_even_with_an_f32_output(self):
        # PyTorch's eager output is in the input type before its conversion.
        self.assertEqual(tp.value_plan(4608, "fp16", "f32", False).limit, 2048)
        self.assertEqual(tp.value_plan(147, "bf16", "f32", False).limit, 256)

    def test_long_reductions_get_sparse_weights(self):
        for reduction, dtype, bias in [(4608, "fp16", False), (4608, "fp16", True),
                                       (256, "bf16", False), (147 * 4, "bf16", True),
                                       (1 << 25, "f32", True)]:
            plan = tp.value_plan(reduction, dtype, dtype, bias)
            self.assertEqual(plan.magnitude, 1)
            self.assertEqual(plan.weight_nonzeros, plan.limit - 1 - (1 if bias else 0))
            self.check(plan, reduction, bias)
        self.assertIsNone(tp.value_plan(255, "bf16", "bf16", False).weight_nonzeros)

    def test_every_rule_stays_below_its_limit(self):
        for dtype in tp.DTYPES:
            for out in ("f32", dtype):
                for reduction in (1, 2, 9, 147, 255, 256, 511, 2047, 2048, 4608, 1 << 22):
                    for bias in (False, True):
                        self.check(tp.value_plan(reduction, dtype, out, bias), reduction, bias)


class Protocol(unittest.TestCase):
    L2 = 50 << 20
    FREE = 80 << 30

    def test_a_rotation_touches_more_than_twice_the_l2(self):
        self.assertEqual(tp.copies_per_rotation(1 << 20, self.L2, self.FREE), 101)
        self.assertEqual(tp.copies_per_rotation(3 << 20, self.L2, self.FREE), 34)
        self.assertGreater(34 * (3 << 20), 2 * self.L2)
        self.assertEqual(tp.copies_per_rotation(200 << 20, self.L2, self.FREE), 1)

    def test_tiny_sets_are_capped(self):
        self.assertEqual(tp.copies_per_rotation(4096, self.L2, self.FREE), 1000)
        self.assertEqual(tp.copies_per_rotation(0, self.L2, self.FREE), 1000)

    def test_copies_fit_in_a_quarter_of_free_memory(self):
        # 1 GiB free: a 256 MiB budget; 2 x 512 MiB L2 would want 17 copies of 64 MiB.
        self.assertEqual(tp.copies_per_rotation(64 << 20, 512 << 20, 1 << 30), 4)
        self.assertEqual(tp.copies_per_rotation(100 << 20, 512 << 20, 1 << 30), 2)
        # Not even two fit: one.
        self.assertEqual(tp.copies_per_rotation(150 << 20, 512 << 20, 1 << 30), 1)
        self.assertEqual(tp.copies_per_rotation(10 << 30, 512 << 20, 1 << 30), 1)

    def test_statistics(self):
        self.assertEqual(tp.median([3.0, 1.0, 2.0]), 2.0)
        self.assertEqual(tp.median([4.0, 1.0, 3.0, 2.0]), 2.5)
        self.assertTrue(tp.median([]) != tp.median([]))  # NaN
        self.assertAlmostEqual(tp.percentile(list(range(11)), 10), 1.0)
        self.assertAlmostEqual(tp.percentile([1.0, 2.0], 90), 1.9)
        self.assertAlmostEqual(tp.geomean([2.0, 8.0]), 4.0)
        self.assertIsNone(tp.geomean([]))
        self.assertAlmostEqual(tp.geomean([4.0, None, float("nan")]), 4.0)

    def test_batches_and_stopping(self):
        budget, count, cap = 25_000.0, 10, 2500
        self.assertEqual(tp.next_batch([], budget, count, cap), 10)
        self.assertEqual(tp.next_batch([1000.0] * 10, budget, count, cap), 15)
        self.assertEqual(tp.next_batch([5.0] * 10, budget, count, cap), tp.MAX_BATCH)
        self.assertEqual(tp.next_batch([5.0] * 2490, budget, count, cap), 10)
        self.assertEqual(tp.next_batch([50_000.0] * 3, budget, count, cap), 7)
        self.assertFalse(tp.enough([1000.0] * 10, budget, count, cap))
        self.assertFalse(tp.enough([30_000.0] * 2, budget, count, cap))
        self.assertTrue(tp.enough([3000.0] * 10, budget, count, cap))
        self.assertTrue(tp.enough([1.0] * cap, budget, count, cap))

    def test_spin_covers_the_enqueue_of_a_batch(self):
        self.assertEqual(tp.spin_us(100, 4.0), 520.0)
        self.assertEqual(tp.spin_us(256, 1e6), tp.MAX_SPIN_US)

    def test_slow_hosts_get_batches_the_spin_covers(self):
        self.assertEqual(tp.batch_cap_for_spin(5.0), tp.MAX_BATCH)
        cap = tp.batch_cap_for_spin(150.0)
        self.assertEqual(cap, 106)
        self.assertLessEqual(tp.spin_us(cap, 150.0), tp.MAX_SPIN_US)
        self.assertGreater(tp.spin_us(cap + 1, 150.0), tp.MAX_SPIN_US - 1)
        self.assertEqual(tp.batch_cap_for_spin(1e9), 1)

    def test_eager_picks_are_named_in_order(self):
        self.assertEqual(tp.eager_pick_names(1), ["eager"])
        self.assertEqual(tp.eager_pick_names(3), ["eager", "eager pick 2", "eager pick 3"])

    def test_the_fastest_pick_is_kept(self):
        entries = [{"median_us": 9.0}, None, {"median_us": 7.5}, {"median_us": None},
                   {"median_us": 7.5}]
        self.assertEqual(tp.fastest_pick(entries), 2)
        self.assertIsNone(tp.fastest_pick([None, {"median_us": None}]))
        self.assertIsNone(tp.fastest_pick([]))

    def test_a_worker_runs_calls_on_its_own_thread_in_order(self):
        import threading  # noqa: PLC0415
        worker = tp.Worker("eager pick 2")
        try:
            seen = []
            for i in range(3):
                self.assertEqual(worker.run(lambda i=i: seen.append(i) or i * i), i * i)
            self.assertEqual(seen, [0, 1, 2])
            here = threading.get_ident()
            there = {worker.run(threading.get_ident) for _ in range(3)}
            self.assertEqual(len(there), 1)
            self.assertNotIn(here, there)
            self.assertEqual(tp.Inline().run(threading.get_ident), here)

            def boom():
                raise RuntimeError("cuDNN said no")
            with self.assertRaisesRegex(RuntimeError, "cuDNN said no"):
                worker.run(boom)
            self.assertEqual(worker.run(lambda: "still serving"), "still serving")
        finally:
            worker.close()
        self.assertFalse(worker._thread.is_alive())

    def test_sides_alternate_their_order(self):
        sides = ["ours", "eager", "compile"]
        self.assertEqual(tp.round_order(sides, 0), sides)
        self.assertEqual(tp.round_order(sides, 1), ["compile", "eager", "ours"])
        self.assertEqual(tp.round_order(sides, 2), sides)


def row(task, ours, eager, compile_, exact=True, count=1, warm=None, **extra):
    """A report row with cold medians (and warm ones, the same unless given)."""
    warm = warm or (ours, eager, compile_)

    def side(us):
        return None if us is None else {"median_us": us, "p10_us": us, "p90_us": us,
                                        "samples": 40}

    r = {"task": task, "count": count, "op": "conv2d", "dtype": "fp16", "out_dtype": "f32",
         "layout": "nhwc", "exact": exact, "error": None, "compile_error": None,
         "eager_error": None, "notes": [],
         "cold": {"ours": side(ours), "eager": side(eager), "compile": side(compile_)},
         "warm": {k: (None if v is None else {"median_us": v})
                  for k, v in zip(("ours", "eager", "compile"), warm)}}
    for protocol, prefix in (("cold", ""), ("warm", "warm_")):
        for other in ("eager", "compile"):
            o, t = r[protocol]["ours"], r[protocol][other]
            r[f"{prefix}speedup_vs_{other}"] = t["median_us"] / o["median_us"] if o and t else None
    r.update(extra)
    return r


class Report(unittest.TestCase):
    ROWS = [
        row("conv_a", 10.0, 20.0, 5.0, count=2),
        row("conv_b", 10.0, 5.0, None, compile_error="BackendCompilerFailed: boom",
            notes=["asymmetric padding applied with F.pad"]),
        row("conv_c", 1.0, 100.0, 100.0, exact=False),
    ]

    def report(self):
        report = {"device": H100, "torch": "2.11.0", "cudnn": 91000, "cuda": "13.0",
                  "triton": None, "date": "2026-01-01T00:00:00+00:00",
                  "command": "torch_peer.py --deploy d --out o", "protocols": tp.PROTOCOLS,
                  "rows": self.ROWS,
                  "skipped": [{"task": "conv_d", "source": "deploy:d", "reason": "no task shape"}]}
        report.update(tp.summarize(self.ROWS, counts_given=True))
        return report

    def test_geomeans_leave_out_inexact_rows(self):
        r = self.report()
        self.assertAlmostEqual(r["geomean_vs_eager"], 1.0)  # sqrt(2 * 0.5)
        self.assertEqual(r["compared"], 2)
        self.assertAlmostEqual(r["geomean_vs_compile"], 0.5)
        self.assertEqual(r["compared_vs_compile"], 1)
        self.assertAlmostEqual(r["warm_geomean_vs_eager"], 1.0)
        totals = r["weighted_totals"]["cold"]["eager"]
        # conv_a counts twice: ours 2*10 + 10, eager 2*20 + 5.
        self.assertEqual((totals["rows"], totals["ours_us"], totals["eager_us"]), (2, 30.0, 45.0))
        self.assertAlmostEqual(totals["speedup"], 1.5)
        json.dumps(r, allow_nan=False)  # the report is strict JSON

    def test_first_pick_geomean_and_picks_section(self):
        rows = [row("conv_a", 10.0, 20.0, 5.0), row("conv_b", 10.0, 5.0, None)]
        rows[0]["eager_picks"] = [{"cold": {"median_us": 30.0}, "warm": {"median_us": 40.0}},
                                  {"cold": {"median_us": 20.0}, "warm": None}]
        rows[1]["eager_picks"] = [{"cold": {"median_us": 5.0}, "warm": {"median_us": 5.0}}]
        summary = tp.summarize(rows, counts_given=False)
        self.assertAlmostEqual(summary["geomean_vs_eager_first_pick"], 1.2247, places=4)
        self.assertAlmostEqual(summary["geomean_vs_eager"], 1.0)  # sqrt(2 * 0.5)
        self.assertAlmostEqual(summary["warm_geomean_vs_eager_first_pick"], 1.4142, places=4)
        report = dict(self.report(), rows=rows, settings={"cudnn_benchmark_limit": 0,
                                                          "eager_picks": 2}, **summary)
        lines = tp.render_markdown(report).splitlines()
        self.assertIn("- eager: `cudnn.benchmark` times every cuDNN configuration per "
                      "convolution (`torch.backends.cudnn.benchmark_limit = 0`), choosing "
                      "afresh on each of 2 threads; the fastest pick is kept", lines)
        self.assertIn("- against eager's first pick alone (one PyTorch process's choice): "
                      "1.22× cold, 1.41× warm", lines)
        self.assertIn("## Eager's picks", lines)
        self.assertIn("- `conv_a`: cold 30.00, 20.00; warm 40.00, -", lines)
        self.assertFalse(any(l.startswith("- `conv_b`: cold") for l in lines))

    def test_no_comparable_rows(self):
        summary = tp.summarize([row("x", 1.0, 2.0, None, exact=False)], counts_given=False)
        self.assertIsNone(summary["geomean_vs_eager"])
        self.assertEqual(summary["compared"], 0)

    def test_markdown(self):
        md = tp.render_markdown(self.report())
        lines = md.splitlines()
        self.assertEqual(lines[0], "# tilesched beside PyTorch")
        self.assertIn(f"- device: {H100}", lines)
        self.assertIn("- torch 2.11.0, CUDA 13.0, cuDNN 91000, Triton -", lines)
        table = [l for l in lines if l.startswith("| `")]
        self.assertEqual(len(table), 3)
        self.assertEqual(
            table[0], "| `conv_a` ×2 | fp16→f32 nhwc | 10.00 | 20.00 | 5.00 | 2.00× | 0.50× "
                      "| 10.00 | 20.00 | 5.00 | 2.00× | 0.50× | yes |")
        self.assertIn("| 10.00 | 5.00 | - | 0.50× | - |", table[1])
        self.assertTrue(table[2].endswith("| **NO** |"))
        self.assertIn("- geomean speedup, cold: 1.00× vs eager (2 rows), 0.50× vs compile "
                      "(1 rows)", lines)
        self.assertIn("- `conv_b`: asymmetric padding applied with F.pad", lines)
        self.assertIn("- `conv_d` (deploy:d): no task shape", lines)
        self.assertIn("- `conv_b` (torch.compile): BackendCompilerFailed: boom", lines)
        header = [l for l in lines if l.startswith("| task")][0]
        self.assertEqual(header.count("|") - 1, len(table[0].split(" | ")))
        self.assertFalse(any(l.startswith("- eager:") for l in lines))

    def test_markdown_says_how_many_cudnn_configurations_eager_timed(self):
        for limit, words in ((0, "every cuDNN configuration"),
                             (10, "at most 10 cuDNN configurations")):
            report = dict(self.report(), settings={"cudnn_benchmark_limit": limit})
            self.assertIn(f"- eager: `cudnn.benchmark` times {words} per convolution "
                          f"(`torch.backends.cudnn.benchmark_limit = {limit}`)",
                          tp.render_markdown(report).splitlines())


class Inputs(unittest.TestCase):
    TASK = conv(1, 64, 56, 56, 64, 3, 3, 1, 1)
    KEY = "conv2d_n1_c64_h56_w56_k64_r3_s3_st1_p1"

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, data):
        path = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data if isinstance(data, (bytes, str)) else json.dumps(data))
        return path

    def entry(self, key, shape, cubin, image, gpu=H100, sha=None):
        self.write(cubin, image)
        return {"gpu": gpu, "compute_capability": [9, 0], "task": key, "shape": shape,
                "kernel": "k0", "launch": {"grid": 196, "block": 128,
                                           "dynamic_shared_bytes": 65536, "zero_output": True},
                "cubin": cubin, "sha256": sha or hashlib.sha256(image).hexdigest(),
                "stage1_us": 9.0, "final_us": 8.0, "stage": "sass", "created_by": "test"}

    def test_deploy_cache(self):
        other = conv(1, 64, 56, 56, 64, 1, 1, 1, 0)
        entries = [
            self.entry(self.KEY, self.TASK, "cubins/a.cubin", b"\x7fELF a"),
            self.entry("conv2d_old", None, "cubins/b.cubin", b"\x7fELF b"),
            self.entry(self.KEY + "_bias", self.TASK, "cubins/c.cubin", b"\x7fELF c"),
            self.entry("conv2d_n1_c64_h56_w56_k64_r1_s1_st1_p0", other, "cubins/d.cubin",
                       b"\x7fELF d", sha="0" * 64),
            self.entry("conv2d_n1_c64_h56_w56_k64_r1_s1_st1_p0", other, "cubins/e.cubin",
                       b"\x7fELF e", gpu="NVIDIA H200"),
        ]
        self.write("index.json", {"version": 1, "entries": entries})
        found, skipped = tp.load_deploy(self.dir)
        self.assertEqual([c.key for c in found], [self.KEY, "conv2d_n1_c64_h56_w56_k64_r1_s1_st1_p0"])
        a = found[0]
        self.assertEqual((a.kernel, a.launch.grid, a.launch.block, a.launch.dynamic_shared_bytes,
                          a.launch.zero_output, a.tuned_us, a.image),
                         ("k0", (196, 1, 1), (128, 1, 1), 65536, True, 8.0, b"\x7fELF a"))
        reasons = [s["reason"] for s in skipped]
        self.assertEqual(len(reasons), 3)
        self.assertIn("no task shape", reasons[0])
        self.assertIn(f"not {self.KEY}_bias", reasons[1])
        self.assertIn("sha256", reasons[2])
        kept, foreign = tp.select_for_device(found, H100, (9, 0))
        self.assertEqual([c.key for c in kept], [self.KEY])
        self.assertIn("tuned for NVIDIA H200 (sm_90)", foreign[0]["reason"])

    def test_deploy_launch_forms(self):
        image = b"\x7fELF a"
        grid3 = self.entry(self.KEY, self.TASK, "cubins/a.cubin", image)
        grid3["launch"]["grid"] = [4, 3, 2]
        clustered = self.entry(self.KEY, self.TASK, "cubins/a.cubin", image)
        clustered["launch"]["cluster"] = [2, 1, 1]
        # A cluster of blocks along x only may be written as a plain number.
        number = self.entry(self.KEY, self.TASK, "cubins/a.cubin", image)
        number["launch"]["cluster"] = 2
        one = self.entry(self.KEY, self.TASK, "cubins/a.cubin", image)
        one["launch"]["cluster"] = [1, 1, 1]
        self.write("index.json", {"version": 1, "entries": [grid3, clustered, number, one]})
        found, skipped = tp.load_deploy(self.dir)
        self.assertEqual(skipped, [])
        self.assertEqual([c.launch.grid for c in found],
                         [(4, 3, 2), (196, 1, 1), (196, 1, 1), (196, 1, 1)])
        self.assertEqual([c.launch.cluster for c in found],
                         [(1, 1, 1), (2, 1, 1), (2, 1, 1), (1, 1, 1)])

    def test_deploy_clusters_must_divide_the_grid(self):
        image = b"\x7fELF a"
        broken = []
        for grid, cluster in ((195, [2, 1, 1]), ([4, 3, 2], [1, 2, 1]), ([4, 3, 2], [2, 1, 4]),
                              (196, [0, 1, 1]), (196, [2, 1])):
            entry = self.entry(self.KEY, self.TASK, "cubins/a.cubin", image)
            entry["launch"].update(grid=grid, cluster=cluster)
            broken.append(entry)
        self.write("index.json", {"version": 1, "entries": broken})
        found, skipped = tp.load_deploy(self.dir)
        self.assertEqual(found, [])
        reasons = [s["reason"] for s in skipped]
        self.assertEqual(len(reasons), len(broken))
        self.assertIn("cluster [2, 1, 1] does not divide grid [195, 1, 1] in every "
                      "dimension", reasons[0])
        self.assertIn("cluster [1, 2, 1] does not divide grid [4, 3, 2]", reasons[1])
        self.assertIn("cluster [2, 1, 4] does not divide grid [4, 3, 2]", reasons[2])
        for reason in reasons[3:]:
            self.assertIn("cluster", reason)
            self.assertIn("is not a positive number or [x, y, z]", reason)

    MATMUL = {"op": "matmul", "m": 4096, "n": 4096, "k": 4096, "dtype": "fp16",
              "out_dtype": "fp16"}
    MATMUL_KEY = "matmul_m4096_n4096_k4096_fp16_out_fp16"
    MAPS = [{"buffer": 0, "tensor": A_FP16},
            {"buffer": 1, "tensor": box("fp16", [4096, 4096], [8192], [64, 256], "b128")}]

    def test_deploy_workspace_and_tensor_maps(self):
        image = b"\x7fELF w"
        wgmma = self.entry(self.MATMUL_KEY, self.MATMUL, "cubins/w.cubin", image)
        wgmma["launch"].update(target="arch_specific", workspace_bytes=4096,
                               tensor_maps=self.MAPS)
        plain = self.entry(self.KEY, self.TASK, "cubins/a.cubin", b"\x7fELF a")
        broken = []
        for changes in ({"workspace_bytes": -1}, {"workspace_bytes": 1.5},
                        {"workspace_bytes": None}, {"tensor_maps": {"buffer": 0}},
                        {"tensor_maps": [{"buffer": 3, "tensor": A_FP16}]},
                        {"tensor_maps": [{"buffer": 0, "tensor": box(
                            "fp16", [4096, 4096], [8192, 16], [64, 128], "b128")}]},
                        {"tensor_maps": [{"buffer": 0, "tensor": box(
                            "fp16", [4096, 4096], [8200], [64, 128], "b128")}]},
                        {"tensor_maps": [{"buffer": 0, "tensor": box(
                            "fp16", [4096, 4096], [8192], [64, 512], "b128")}]}):
            entry = self.entry(self.MATMUL_KEY, self.MATMUL, "cubins/w.cubin", image)
            entry["launch"].update(changes)
            broken.append(entry)
        self.write("index.json", {"version": 1, "entries": [wgmma, plain] + broken})
        found, skipped = tp.load_deploy(self.dir)
        self.assertEqual([c.key for c in found], [self.MATMUL_KEY, self.KEY])
        w, a = found[0].launch, found[1].launch
        self.assertEqual(w.workspace_bytes, 4096)
        self.assertEqual([m.buffer for m in w.tensor_maps], [0, 1])
        self.assertEqual(w.tensor_maps[0].tensor,
                         {"dtype": "fp16", "dims": (4096, 4096), "strides": (8192,),
                          "boxed": (64, 128), "swizzle": "b128"})
        self.assertEqual(w.tensor_maps[1].tensor["boxed"], (64, 256))
        self.assertEqual((a.workspace_bytes, a.tensor_maps), (0, ()))
        reasons = [s["reason"] for s in skipped]
        self.assertEqual(len(reasons), len(broken))
        for reason in reasons:
            self.assertTrue(reason.startswith("malformed entry: "), reason)
        self.assertIn("workspace_bytes must be a non-negative integer", reasons[0])
        self.assertIn("tensor_maps", reasons[3])
        self.assertIn("buffer 3 is not the index of one of the kernel's 3 buffers",
                      reasons[4])
        self.assertIn("1 to 5 dimensions", reasons[5])
        self.assertIn("stride 8200 bytes", reasons[6])
        self.assertIn("box extent 512", reasons[7])

    def test_unreadable_index(self):
        with self.assertRaises(tp.InputError):
            tp.load_deploy(self.dir)
        self.write("index.json", "{not json")
        with self.assertRaises(tp.InputError):
            tp.load_deploy(self.dir)

    def sidecar(self, name="k.cubin", **changes):
        sidecar = {"task": self.KEY, "shape": self.TASK, "kernel": "k0", "format": "cubin",
                   "dtype": "f32", "out_dtype": "f32", "layout": "nchw", "arch": "sm_90",
                   "grid": [196, 1, 1], "block": [128, 1, 1], "dynamic_shared_bytes": 0,
                   "zero_output": False, "median_us": 7.5, "device": H100}
        sidecar.update(changes)
        return self.write(name + ".json", sidecar)

    def test_export_sidecar(self):
        self.write("k.cubin", b"\x7fELF k")
        found, skipped = tp.load_export(self.sidecar())
        self.assertEqual(skipped, [])
        self.assertEqual((found.key, found.image, found.tuned_us, found.compute_capability),
                         (self.KEY, b"\x7fELF k", 7.5, (9, 0)))
        self.assertEqual(found.image_path, os.path.join(self.dir, "k.cubin"))
        self.assertEqual(found.launch.cluster, (1, 1, 1))  # no cluster field
        found, skipped = tp.load_export(self.sidecar(shape=None))
        self.assertIsNone(found)
        self.assertIn("no task shape", skipped[0]["reason"])
        with self.assertRaises(tp.InputError):
            tp.load_export(self.sidecar("missing.cubin"))
        with self.assertRaises(tp.InputError):
            tp.load_export(self.sidecar(grid=[196, 1]))
        with self.assertRaises(tp.InputError):
            tp.load_export(self.sidecar(dtype="fp16"))

    def test_export_clusters(self):
        self.write("k.cubin", b"\x7fELF k")
        found, skipped = tp.load_export(self.sidecar(cluster=[2, 1, 1]))
        self.assertEqual(skipped, [])
        self.assertEqual((found.launch.grid, found.launch.cluster), ((196, 1, 1), (2, 1, 1)))
        found, _ = tp.load_export(self.sidecar(cluster=[1, 1, 1]))
        self.assertEqual(found.launch.cluster, (1, 1, 1))
        found, _ = tp.load_export(self.sidecar(grid=[8, 6, 4], cluster=[2, 3, 4]))
        self.assertEqual(found.launch.cluster, (2, 3, 4))
        with self.assertRaises(tp.InputError) as e:
            tp.load_export(self.sidecar(grid=[195, 1, 1], cluster=[2, 1, 1]))
        self.assertIn("cluster [2, 1, 1] does not divide grid [195, 1, 1] in every dimension",
                      str(e.exception))
        self.assertIn("export sidecar", str(e.exception))
        for cluster in ([0, 1, 1], [2, 1], "2"):
            with self.subTest(cluster=cluster), self.assertRaises(tp.InputError) as e:
                tp.load_export(self.sidecar(cluster=cluster))
            self.assertIn("is not a positive number or [x, y, z]", str(e.exception))

    def test_export_workspace_and_tensor_maps(self):
        self.write("w.cubin", b"\x7fELF w")
        self.write("k.cubin", b"\x7fELF k")
        wgmma = dict(name="w.cubin", task=self.MATMUL_KEY, shape=self.MATMUL, dtype="fp16",
                     out_dtype="fp16", arch="sm_90a")
        found, skipped = tp.load_export(self.sidecar(workspace_bytes=8192,
                                                     tensor_maps=self.MAPS, **wgmma))
        self.assertEqual(skipped, [])
        self.assertEqual(found.launch.workspace_bytes, 8192)
        self.assertEqual([m.buffer for m in found.launch.tensor_maps], [0, 1])
        self.assertEqual(found.launch.tensor_maps[0].tensor["strides"], (8192,))
        self.assertEqual(found.compute_capability, (9, 0))  # sm_90a runs on sm_90
        # The exporter writes both fields always: 0 and [] when there are none.
        found, _ = tp.load_export(self.sidecar(workspace_bytes=0, tensor_maps=[]))
        self.assertEqual((found.launch.workspace_bytes, found.launch.tensor_maps), (0, ()))
        found, _ = tp.load_export(self.sidecar())
        self.assertEqual((found.launch.workspace_bytes, found.launch.tensor_maps), (0, ()))
        for changes in ({"workspace_bytes": -8}, {"workspace_bytes": "8192"},
                        {"tensor_maps": "none"},
                        {"tensor_maps": [{"buffer": 2, "tensor": A_FP16}, {"buffer": 3}]},
                        {"tensor_maps": [{"buffer": 0, "tensor": box(
                            "fp16", [4096, 4096], [], [64, 128], "b128")}]},
                        {"tensor_maps": [{"buffer": 0, "tensor": box(
                            "fp16", [4096, 4096], [8192], [64, 128], "128B")}]}):
            with self.subTest(changes=changes), self.assertRaises(tp.InputError) as e:
                tp.load_export(self.sidecar(**dict(wgmma, **changes)))
            self.assertIn("export sidecar", str(e.exception))

    def test_foreign_sidecars(self):
        self.write("k.cubin", b"\x7fELF k")
        found, _ = tp.load_export(self.sidecar(arch="sm_100", device="NVIDIA B200"))
        kept, skipped = tp.select_for_device([found], H100, (9, 0))
        self.assertEqual(kept, [])
        self.assertIn("sm_100", skipped[0]["reason"])
        found, _ = tp.load_export(self.sidecar(device="NVIDIA H100 PCIe"))
        kept, _ = tp.select_for_device([found], H100, (9, 0))
        self.assertIn("tuned on NVIDIA H100 PCIe", kept[0].notes[0])

    def test_choose_tasks(self):
        self.write("k.cubin", b"\x7fELF k")
        a, _ = tp.load_export(self.sidecar())
        b, _ = tp.load_export(self.sidecar())
        chosen, skipped = tp.choose_tasks([a, b], None, None)
        self.assertEqual(len(chosen), 1)
        self.assertIn("duplicate", skipped[0]["reason"])
        self.assertEqual(tp.choose_tasks([a], "matmul", None)[0], [])
        self.assertEqual(tp.choose_tasks([a], "k64_r3", 0)[0], [])

    def test_counts(self):
        self.assertEqual(tp.load_counts(None), {})
        self.assertEqual(tp.load_counts(self.write("c.json", {self.KEY: 3})), {self.KEY: 3})
        with self.assertRaises(tp.InputError):
            tp.load_counts(self.write("bad.json", {self.KEY: "three"}))


class CommandLine(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def assert_one_line_failure(self, result):
        self.assertEqual(result.returncode, 2, result.stderr)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(lines[0].startswith("torch_peer: "), lines[0])
        return lines[0]

    def test_missing_torch_exits_2_with_one_line(self):
        fake = os.path.join(self.dir, "fake")
        os.makedirs(os.path.join(fake, "torch"))
        with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('no torch in this test')\n")
        with open(os.path.join(self.dir, "k.cubin"), "wb") as f:
            f.write(b"\x7fELF")
        sidecar = os.path.join(self.dir, "k.cubin.json")
        with open(sidecar, "w") as f:
            json.dump({"task": "matmul_m8_n8_k8", "kernel": "k0",
                       "shape": {"op": "matmul", "m": 8, "n": 8, "k": 8},
                       "grid": [1, 1, 1], "block": [32, 1, 1], "dynamic_shared_bytes": 0,
                       "zero_output": False}, f)
        env = dict(os.environ, PYTHONPATH=fake)
        result = run_script(["--export", sidecar, "--out", os.path.join(self.dir, "out")], env)
        line = self.assert_one_line_failure(result)
        self.assertIn("cannot import torch", line)
        self.assertIn("no torch in this test", line)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "out")))

    def test_bad_arguments_exit_2_with_one_line(self):
        for args in ([], ["--out", self.dir], ["--export", "x.json"],
                     ["--deploy", self.dir, "--out", self.dir, "--rounds", "0"],
                     ["--deploy", self.dir, "--out", self.dir, "--cudnn-benchmark-limit", "-1"],
                     ["--deploy", self.dir, "--out", self.dir, "--eager-picks", "0"]):
            line = self.assert_one_line_failure(run_script(args))
            self.assertIn("error", line)

    def test_unreadable_inputs_exit_2_with_one_line(self):
        line = self.assert_one_line_failure(
            run_script(["--export", os.path.join(self.dir, "none.json"), "--out", self.dir]))
        self.assertIn("cannot read export sidecar", line)
        line = self.assert_one_line_failure(run_script(["--deploy", self.dir, "--out", self.dir]))
        self.assertIn("cannot read deploy index", line)

    def test_importing_does_not_import_torch(self):
        if not torch_already_imported:
            self.assertNotIn("torch", sys.modules)


if __name__ == "__main__":
    unittest.main()
