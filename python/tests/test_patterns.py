"""The rewrite's matching rules, on hand-made graphs (no torch needed)."""

import os
import sys
import unittest

# The source tree, after an installed package (PYTHONPATH) where there is one.
sys.path.append(os.path.join(os.path.dirname(__file__), ".."))

from tilesched.patterns import Node, count_labels, match  # noqa: E402


def graph(*edges, kinds, refused=None):
    """Nodes named by `kinds` (name -> kind), with edges (a, b): b reads a."""
    nodes = {name: Node(name, kind) for name, kind in kinds.items()}
    for a, b in edges:
        nodes[b].inputs.append(a)
        nodes[a].users.append(b)
    for name, why in (refused or {}).items():
        nodes[name].refused = why
    return list(nodes.values())


class Matching(unittest.TestCase):
    def test_conv_bn_relu_folds_and_fuses(self):
        g = graph(("x", "conv"), ("conv", "bn"), ("bn", "relu"), ("relu", "out"),
                  kinds=dict(x="other", conv="conv2d", bn="batchnorm", relu="relu", out="other"))
        matches, left = match(g)
        self.assertEqual([(m.kind, m.anchor, m.batchnorm, m.relu) for m in matches],
                         [("conv2d", "conv", "bn", "relu")])
        self.assertEqual(matches[0].last, "relu")
        self.assertEqual(matches[0].label(), "conv2d+batchnorm+relu")
        self.assertEqual(left, [])

    def test_a_value_read_twice_is_not_fused(self):
        # The residual: bn's output is read by the add as well as the relu.
        g = graph(("x", "conv"), ("conv", "bn"), ("bn", "relu"), ("bn", "add"), ("relu", "add"),
                  kinds=dict(x="other", conv="conv2d", bn="batchnorm", relu="relu", add="other"))
        (m,), _ = match(g)
        self.assertEqual((m.batchnorm, m.relu), ("bn", None))
        # Conv read twice: nothing folds, and the BatchNorm is left with its reason.
        g = graph(("x", "conv"), ("conv", "bn"), ("conv", "other"),
                  kinds=dict(x="other", conv="conv2d", bn="batchnorm", other="other"))
        (m,), left = match(g)
        self.assertEqual((m.batchnorm, m.relu), (None, None))
        self.assertEqual([(n, k) for n, k, _ in left], [("bn", "batchnorm")])

    def test_relu_only_after_what_it_reads_as_data(self):
        # A relu reading the conv as a second input (not its data) is not fused.
        g = graph(("x", "relu"), ("conv", "relu"), kinds=dict(conv="conv2d", x="other", relu="relu"))
        (m,), _ = match(g)
        self.assertIsNone(m.relu)

    def test_linear_relu_and_attention_and_refusals(self):
        g = graph(("x", "fc"), ("fc", "relu"), ("relu", "attn"), ("attn", "mm"), ("x", "mm"),
                  ("mm", "bn"),
                  kinds=dict(x="other", fc="linear", relu="relu", attn="attention", mm="matmul",
                             bn="batchnorm"),
                  refused=dict(mm="an operand is not row-major"))
        matches, left = match(g)
        self.assertEqual([(m.kind, m.relu) for m in matches], [("linear", "relu"), ("attention", None)])
        self.assertEqual(left, [("mm", "matmul", "an operand is not row-major"),
                                ("bn", "batchnorm", "not after a convolution it can fold into")])

    def test_a_refused_batchnorm_is_not_folded(self):
        g = graph(("x", "conv"), ("conv", "bn"), ("bn", "relu"),
                  kinds=dict(x="other", conv="conv2d", bn="batchnorm", relu="relu"),
                  refused=dict(bn="in training mode"))
        (m,), left = match(g)
        self.assertEqual((m.batchnorm, m.relu), (None, None))
        self.assertEqual(left, [("bn", "batchnorm", "in training mode")])

    def test_names_are_unique(self):
        with self.assertRaises(ValueError):
            match([Node("a", "other"), Node("a", "conv2d")])

    def test_counts(self):
        self.assertEqual(count_labels(["add", "Conv2d", "Conv2d", "relu", "add", "Conv2d"]),
                         "3 Conv2d, 2 add, 1 relu")
        self.assertEqual(count_labels([]), "")


if __name__ == "__main__":
    unittest.main()
