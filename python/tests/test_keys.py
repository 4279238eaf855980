"""Task keys as the Rust side writes them; the fixture is also read by tests/cli.rs."""

import os
import sys
import tempfile
import unittest

# The source tree, after an installed package (PYTHONPATH) where there is one.
sys.path.append(os.path.join(os.path.dirname(__file__), ".."))

from tilesched.keys import Task, TaskError, parse_key, read_task_list, task_line, write_task_list  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(__file__), "task-keys.jsonl")


class Keys(unittest.TestCase):
    def test_the_fixture_round_trips(self):
        with open(FIXTURE, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
        pairs = read_task_list(FIXTURE)
        self.assertEqual(len(pairs), 9)
        # Written the same, key for key, byte for byte.
        self.assertEqual([task_line(t, c) for t, c in pairs], lines)
        for task, _ in pairs:
            self.assertEqual(parse_key(task.key()), task)

    def test_keys_of_pytorch_layers(self):
        conv = Task.conv2d(1, 64, 56, 56, 64, 3, 3, pad=(1, 1), bias=True, relu=True,
                           dtype="fp16", out_dtype="fp16", layout="nhwc")
        self.assertEqual(conv.key(), "conv2d_n1_c64_h56_w56_k64_r3_s3_st1_p1_bias_relu_fp16_out_fp16_nhwc")
        self.assertEqual(conv.output_shape(), [1, 64, 56, 56])
        down = Task.conv2d(8, 256, 56, 56, 512, 1, 1, stride=(2, 2))
        self.assertEqual(down.output_shape(), [8, 512, 28, 28])
        odd = Task.conv2d(2, 32, 17, 19, 48, 3, 5, stride=(1, 2), pad=(1, 2), dilation=(2, 1), groups=4)
        self.assertEqual(odd.key(), "conv2d_n2_c32_h17_w19_k48_r3_s5_st1x2_p1x2_d2x1_g4")
        self.assertEqual(odd.output_shape(), [2, 48, 15, 10])
        self.assertEqual(Task.matmul(1576, 768, 3072, bias=True, dtype="bf16").key(),
                         "matmul_m1576_n768_k3072_bias_bf16")
        self.assertEqual(Task.batch_matmul(4, 5, 6, 7).output_shape(), [4, 5, 6])

    def test_refusals_say_what(self):
        cases = [
            (lambda: parse_key("conv3d_n1"), "is not a task key"),
            (lambda: parse_key("matmul_m1_n2_k3_fp16_relu"), "cannot read"),
            (lambda: parse_key("matmul_m1_n2_k03"), "not written the way"),
            (lambda: parse_key("matmul_m1_n2_k3_fp16_out_bf16"), "must be f32 or the input type"),
            (lambda: Task.matmul(0, 1, 1), "field m must be an integer >= 1"),
            (lambda: Task.matmul(1, 1, 1, layout="nhwc"), "row-major"),
            (lambda: Task.conv2d(1, 6, 8, 8, 4, 3, 3, groups=4), "groups do not divide"),
            (lambda: Task.conv2d(1, 4, 2, 2, 4, 5, 5), "does not fit"),
            (lambda: task_line(Task.matmul(1, 1, 1), 0), "positive integer"),
        ]
        for make, expect in cases:
            with self.assertRaises(TaskError) as e:
                make()
            self.assertIn(expect, str(e.exception))
            self.assertEqual(len(str(e.exception).splitlines()), 1)

    def test_task_lists_add_counts_and_refuse_wrong_keys(self):
        a, b = Task.matmul(8, 8, 8), Task.matmul(8, 8, 16)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.jsonl")
            write_task_list(path, [(a, 2), (b, 1), (a, 3)])
            self.assertEqual(read_task_list(path), [(a, 5), (b, 1)])
            with open(path, "w", encoding="utf-8") as f:
                f.write(task_line(a, 1).replace("k8", "k9") + "\n")
            with self.assertRaises(TaskError) as e:
                read_task_list(path)
            self.assertIn("t.jsonl:1: key matmul_m8_n8_k9 does not name its task", str(e.exception))


if __name__ == "__main__":
    unittest.main()
