"""Which layers of a model become tilesched operators: pattern matching on a graph.

The rewrite (`tilesched.torch`) traces a model with torch.fx and describes each node
here as a `Node`: its kind, the nodes it reads and the nodes that read it. `match` finds
what one deployed kernel can compute:

- a convolution, with the BatchNorm after it folded in (inference only: the batch's
  statistics are frozen) and the ReLU after that fused into the epilogue;
- a Linear layer, with a following ReLU fused;
- a self-attention block's two projections (nn.MultiheadAttention called with one
  input as query, key and value, no mask, no weights returned);
- a matrix product of two row-major operands.

A following operation is fused only when the node before it has no other reader: a
value another node still reads must stay as it was. Everything else stays PyTorch's.
Nothing here imports torch, so that the rules are tested without it.
"""

import collections
import dataclasses

KINDS = ("conv2d", "batchnorm", "relu", "linear", "attention", "matmul", "other")


@dataclasses.dataclass
class Node:
    """One graph node, as the rewrite describes it."""

    name: str
    kind: str
    # The nodes whose values it reads, data input first.
    inputs: list = dataclasses.field(default_factory=list)
    # The nodes that read its value.
    users: list = dataclasses.field(default_factory=list)
    # Why a node of a tunable kind cannot be taken as it is (None: it can): an
    # attention call with a mask, a BatchNorm in training mode, ...
    refused: object = None
    # What it is in words, for reports ("Conv2d", "add", ...).
    label: str = ""


@dataclasses.dataclass
class Match:
    """What one operator computes: the anchor node (conv, linear, attention or matmul)
    and the nodes folded into it, in order."""

    kind: str
    anchor: str
    batchnorm: object = None  # name of the folded BatchNorm node, or None
    relu: object = None  # name of the fused ReLU node, or None

    @property
    def nodes(self):
        return [n for n in (self.anchor, self.batchnorm, self.relu) if n is not None]

    @property
    def last(self):
        """The node whose readers read the operator's result instead."""
        return self.nodes[-1]

    def label(self):
        parts = [self.kind] + (["batchnorm"] if self.batchnorm else []) + (["relu"] if self.relu else [])
        return "+".join(parts)


def _sole_reader(graph, name, kind):
    """The node of `kind` that is the only reader of `name`'s value, reading it as its
    data input, or None."""
    users = graph[name].users
    if len(users) != 1:
        return None
    user = graph[users[0]]
    if user.kind != kind or user.refused is not None or user.inputs[:1] != [name]:
        return None
    return user.name


def match(nodes):
    """The operators in `nodes` (listed in execution order), and the tunable nodes
    left as they are with the reason."""
    graph = {n.name: n for n in nodes}
    if len(graph) != len(nodes):
        raise ValueError("node names must be unique")
    taken = set()
    matches, left = [], []
    for node in nodes:
        if node.name in taken or node.kind in ("other", "relu"):
            continue
        if node.kind == "batchnorm":
            left.append((node.name, "batchnorm", node.refused or "not after a convolution it can fold into"))
            continue
        if node.refused is not None:
            left.append((node.name, node.kind, node.refused))
            continue
        m = Match(node.kind, node.name)
        if node.kind == "conv2d":
            m.batchnorm = _sole_reader(graph, node.name, "batchnorm")
        if node.kind in ("conv2d", "linear"):
            m.relu = _sole_reader(graph, m.last, "relu")
        taken.update(m.nodes)
        matches.append(m)
    return matches, left


def count_labels(labels):
    """`3 Conv2d, 1 add`: counts by label, most frequent first, then by name."""
    counts = collections.Counter(labels)
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
