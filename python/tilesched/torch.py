"""A PyTorch model's layers swapped for tilesched's operators, and its task list.

`optimize(model, deploy_dir, example_inputs)` traces the model with torch.fx, propagates
the example inputs' shapes through it, finds what one deployed kernel can compute
(`patterns.match`: a convolution with its BatchNorm folded and its ReLU fused, a Linear
layer with its ReLU, a self-attention block's two projections, a row-major matmul),
and swaps in `torch.ops.tilesched.*` wherever the deploy cache holds the task's kernel
for this GPU. Everything else stays PyTorch's. The result is a `torch.fx.GraphModule`
specialized to the example inputs' shapes, types and memory formats (an input of
another shape is refused by the operators in one line, never computed wrongly); its
`tilesched_report` says what was swapped and what was left, by kind and count.

`tasks(model, example_inputs)` lists the same layers' tasks with their counts, whether
or not a cache holds them; `write_tasks` writes them as a task list for
`tilesched tune --tasks FILE`, so a PyTorch model goes to a deploy cache with no shape
written by hand.
"""

import dataclasses
import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from . import TileschedError, open_cache
from . import ops as _ops  # noqa: F401  (registers torch.ops.tilesched.*)
from .keys import Task, TaskError, write_task_list
from .patterns import Node, count_labels, match

TYPE_NAMES = {torch.float32: "f32", torch.float16: "fp16", torch.bfloat16: "bf16"}
MATMULS = (torch.matmul, operator.matmul, torch.mm, torch.bmm)
RELUS = (F.relu, torch.relu, torch.relu_)


def _meta(node):
    return node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None


def _types(meta):
    """(dtype, out_dtype) of a task reading `meta`: the model's own type in and out."""
    name = TYPE_NAMES.get(meta.dtype)
    if name is None:
        raise TaskError(f"element type {meta.dtype} is not one tilesched tunes")
    return name, name


def _layout(meta):
    shape, stride = list(meta.shape), list(meta.stride)
    dense = torch.empty_strided(shape, stride, device="meta")
    if dense.is_contiguous():
        return "nchw"
    if dense.is_contiguous(memory_format=torch.channels_last):
        return "nhwc"
    raise TaskError(f"input strides {stride} are neither contiguous nor channels_last")


def _conv_task(m, x, bias, relu):
    if not isinstance(m.padding, tuple) or m.padding_mode != "zeros":
        raise TaskError(f"padding {m.padding!r} ({m.padding_mode}) is not a zero pad of fixed size")
    n, c, h, w = x.shape
    dtype, out = _types(x)
    return Task.conv2d(n, c, h, w, m.out_channels, *m.kernel_size, stride=m.stride, pad=m.padding,
                       dilation=m.dilation, groups=m.groups, bias=bias, relu=relu, dtype=dtype,
                       out_dtype=out, layout=_layout(x))


def _rows(x):
    return math.prod(x.shape[:-1])


@dataclasses.dataclass
class Swap:
    """One matched layer: what it computes and the tasks it needs."""

    match: object
    tasks: list  # [Task], one per kernel (two for attention)
    label: str


def _attention_refusal(m, node):
    args = list(node.args) + [None] * (3 - len(node.args))
    if not (args[0] is args[1] is args[2]) or not isinstance(args[0], fx.Node):
        return "query, key and value are not one input"
    kw = node.kwargs
    if kw.get("need_weights", True):
        return "it returns attention weights (need_weights)"
    if any(kw.get(k) is not None for k in ("attn_mask", "key_padding_mask")) or kw.get("is_causal"):
        return "it has a mask"
    if not m.batch_first or not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
        return "not a plain batch-first self-attention"
    if m.in_proj_weight is None:
        return "separate query/key/value weights"
    x = _meta(args[0])
    if x is None or len(x.shape) != 3:
        return "its input is not [batch, length, embedding]"
    return None


def _describe(gm):
    """The graph as `patterns.Node`s, and each node's module (None for functions)."""
    modules = dict(gm.named_modules())
    nodes = []
    for n in gm.graph.nodes:
        kind, refused, label = "other", None, n.op
        module = modules.get(n.target) if n.op == "call_module" else None
        if module is not None:
            label = type(module).__name__
            if isinstance(module, nn.Conv2d):
                kind = "conv2d"
            elif isinstance(module, nn.BatchNorm2d):
                kind = "batchnorm"
                if module.training or module.running_mean is None:
                    refused = "in training mode or without running statistics"
            elif isinstance(module, nn.ReLU):
                kind = "relu"
            elif isinstance(module, nn.Linear):
                kind = "linear"
            elif isinstance(module, nn.MultiheadAttention):
                kind = "attention"
                refused = _attention_refusal(module, n)
        elif n.op == "call_function":
            label = getattr(n.target, "__name__", str(n.target))
            if n.target in RELUS:
                kind = "relu"
            elif n.target in MATMULS:
                kind = "matmul"
        elif n.op == "call_method":
            label = str(n.target)
            if n.target in ("relu", "relu_"):
                kind = "relu"
        if kind in ("conv2d", "linear", "matmul") and refused is None:
            if any(_meta(a) is None for a in n.all_input_nodes):
                refused = "shapes unknown"
        nodes.append(Node(n.name, kind, [a.name for a in n.all_input_nodes],
                          [u.name for u in n.users], refused, label))
    return nodes, modules


def _analyze(model, example_inputs):
    """The traced model, its matched layers with their tasks, the tunable layers left
    (label, reason), and the labels of the nodes nothing here tunes."""
    if model.training:
        raise TileschedError("the model is in training mode: call model.eval() first "
                             "(BatchNorm folds only with frozen statistics)")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    try:
        gm = fx.symbolic_trace(model)
    except Exception as e:
        raise TileschedError(f"torch.fx cannot trace the model: {str(e).splitlines()[0]}") from None
    with torch.no_grad():
        ShapeProp(gm).propagate(*example_inputs)
    described, modules = _describe(gm)
    by_name = {n.name: n for n in gm.graph.nodes}
    matches, left = match(described)
    label_of = {d.name: d.label for d in described}
    left = [(label_of[name], why) for name, _, why in left]
    swaps = []
    for m in matches:
        node = by_name[m.anchor]
        module = modules.get(node.target) if node.op == "call_module" else None
        x = _meta(node.args[0])
        try:
            if m.kind == "conv2d":
                bias = module.bias is not None or m.batchnorm is not None
                tasks = [_conv_task(module, x, bias, m.relu is not None)]
            elif m.kind == "linear":
                dtype, out = _types(x)
                tasks = [Task.matmul(_rows(x), module.out_features, module.in_features,
                                     bias=module.bias is not None, relu=m.relu is not None,
                                     dtype=dtype, out_dtype=out)]
            elif m.kind == "attention":
                dtype, out = _types(x)
                rows, e = _rows(x), module.embed_dim
                tasks = [Task.matmul(rows, 3 * e, e, bias=module.in_proj_bias is not None,
                                     dtype=dtype, out_dtype=out),
                         Task.matmul(rows, e, e, bias=module.out_proj.bias is not None,
                                     dtype=dtype, out_dtype=out)]
            else:
                tasks = [_matmul_task(node)]
        except TaskError as e:
            left.append((label_of[m.anchor], str(e)))
            continue
        swaps.append(Swap(m, tasks, label_of[m.anchor]))
    taken = {name for s in swaps for name in s.match.nodes}
    others = [d.label for d in described
              if d.name not in taken and d.kind not in ("conv2d", "linear", "attention", "matmul")
              and d.label not in ("placeholder", "output", "get_attr")]
    return gm, swaps, left, others


def _matmul_task(node):
    a, b = (_meta(x) for x in node.args[:2])
    if a is None or b is None or a.dtype != b.dtype:
        raise TaskError("operands of unknown or different types")
    for t in (a, b):
        if not torch.empty_strided(list(t.shape), list(t.stride), device="meta").is_contiguous():
            raise TaskError("an operand is not row-major")
    dtype, out = _types(a)
    if len(a.shape) == 2 and len(b.shape) == 2 and a.shape[1] == b.shape[0]:
        return Task.matmul(a.shape[0], b.shape[1], a.shape[1], dtype=dtype, out_dtype=out)
    if (len(a.shape) == 3 and len(b.shape) == 3 and a.shape[0] == b.shape[0]
            and a.shape[2] == b.shape[1]):
        return Task.batch_matmul(a.shape[0], a.shape[1], b.shape[2], a.shape[2], dtype=dtype,
                                 out_dtype=out)
    raise TaskError(f"shapes {list(a.shape)} x {list(b.shape)} broadcast")


def tasks(model, example_inputs):
    """The model's tasks as `(Task, count)` pairs, in the order first met."""
    _, swaps, _, _ = _analyze(model, example_inputs)
    counts = {}
    for s in swaps:
        for t in s.tasks:
            counts[t] = counts.get(t, 0) + 1
    return list(counts.items())


def write_tasks(model, example_inputs, path):
    """Writes the model's task list for `tilesched tune --tasks PATH`; returns it."""
    workloads = tasks(model, example_inputs)
    write_task_list(path, workloads)
    return workloads


@dataclasses.dataclass
class Report:
    """What `optimize` swapped and what it left to PyTorch."""

    swapped: list  # [(label, [key])]
    left: list  # [(label, reason)]
    others: list  # labels of the nodes nothing here tunes

    def __str__(self):
        lines = [f"swapped {len(self.swapped)} layer(s): "
                 f"{count_labels(label for label, _ in self.swapped) or 'none'}"]
        if self.left:
            reasons = {}
            for label, why in self.left:
                reasons.setdefault(why, []).append(label)
            for why, labels in reasons.items():
                lines.append(f"left to PyTorch ({why}): {count_labels(labels)}")
        if self.others:
            lines.append(f"not tuned: {count_labels(self.others)}")
        return "\n".join(lines)


class TiledConv2d(nn.Module):
    """A convolution (BatchNorm folded, ReLU fused) run by a deployed kernel."""

    def __init__(self, cache, key, weight, bias):
        super().__init__()
        self.cache, self.key = cache, key
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)

    def forward(self, x):
        return torch.ops.tilesched.conv2d(x, self.weight, self.bias, self.cache, self.key)

    def extra_repr(self):
        return self.key


class TiledLinear(nn.Module):
    """A Linear layer (ReLU fused) run by a deployed matmul kernel on `[rows, in]`."""

    def __init__(self, cache, key, weight_t, bias):
        super().__init__()
        self.cache, self.key = cache, key
        self.register_buffer("weight_t", weight_t)
        self.register_buffer("bias", bias)

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1]).contiguous()  # a view (ViT's class token) is copied
        out = torch.ops.tilesched.matmul(rows, self.weight_t, self.bias, self.cache, self.key)
        return out.view(*x.shape[:-1], out.shape[-1])

    def extra_repr(self):
        return self.key


class TiledSelfAttention(nn.Module):
    """nn.MultiheadAttention's self-attention (batch first, no mask, no weights
    returned) with its two projections run by deployed matmul kernels where the cache
    has them, and PyTorch's scaled_dot_product_attention between them."""

    def __init__(self, cache, mha, keys):
        super().__init__()
        self.cache, self.keys = cache, keys
        self.heads, self.embed = mha.num_heads, mha.embed_dim
        self.register_buffer("in_weight_t", mha.in_proj_weight.detach().t().contiguous())
        self.register_buffer("in_bias", _detach(mha.in_proj_bias))
        self.register_buffer("out_weight_t", mha.out_proj.weight.detach().t().contiguous())
        self.register_buffer("out_bias", _detach(mha.out_proj.bias))

    def _project(self, x, which, weight_t, bias):
        key = self.keys[which]
        if key is None:
            out = x @ weight_t
            return out if bias is None else out + bias
        return torch.ops.tilesched.matmul(x, weight_t, bias, self.cache, key)

    def forward(self, query, key=None, value=None, need_weights=False, **_):
        b, length, e = query.shape
        d = e // self.heads
        qkv = self._project(query.reshape(b * length, e), 0, self.in_weight_t, self.in_bias)
        q, k, v = qkv.view(b, length, 3, self.heads, d).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v)
        o = o.transpose(1, 2).reshape(b * length, e)
        out = self._project(o, 1, self.out_weight_t, self.out_bias)
        return out.view(b, length, e), None

    def extra_repr(self):
        return ", ".join(k or "PyTorch" for k in self.keys)


def _detach(t):
    return None if t is None else t.detach().clone()


def _folded(conv, bn):
    """The convolution's weight and bias with `bn` (eval) folded in, in float32."""
    w = conv.weight.detach().float()
    b = conv.bias.detach().float() if conv.bias is not None else torch.zeros(
        w.shape[0], device=w.device)
    if bn is None:
        return w, (b if conv.bias is not None else None)
    scale = torch.rsqrt(bn.running_var.float() + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.detach().float()
    shift = bn.bias.detach().float() if bn.bias is not None else torch.zeros_like(scale)
    return w * scale.view(-1, 1, 1, 1), (b - bn.running_mean.float()) * scale + shift


def optimize(model, deploy_dir, example_inputs, device=None):
    """`model` with every layer whose kernel `deploy_dir` holds for this GPU swapped for
    tilesched's operators (see the module's doc); `.tilesched_report` says what."""
    gm, swaps, left, others = _analyze(model, example_inputs)
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if device is None:
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda), None)
        if device is None:
            raise TileschedError("the example inputs are not on a CUDA device: give them on the GPU "
                                 "the model will run on")
    cache = open_cache(deploy_dir, torch.device(device).index or 0)
    held = set(cache.tasks())
    wanted = [t.key() for s in swaps for t in s.tasks]
    if wanted and not held.intersection(wanted):
        try:  # the runtime's own words: a cache for another GPU, or which tasks it holds
            cache.kernel(wanted[0])
        except Exception as e:
            raise TileschedError(f"no kernel of the model's tasks in {deploy_dir} for this GPU: "
                                 f"{str(e).splitlines()[0]}") from None
    modules = dict(gm.named_modules())
    by_name = {n.name: n for n in gm.graph.nodes}
    swapped = []
    for s in swaps:
        keys = [t.key() if t.key() in held else None for t in s.tasks]
        label = s.match.label()
        if all(k is None for k in keys):
            left.append((label, "no kernel in the deploy cache"))
            continue
        anchor = by_name[s.match.anchor]
        module = modules.get(anchor.target) if anchor.op == "call_module" else None
        task = s.tasks[0]
        dtype = _ops.TORCH_DTYPES[task.dtype]
        if s.match.kind == "conv2d":
            bn = modules[by_name[s.match.batchnorm].target] if s.match.batchnorm else None
            w, b = _folded(module, bn)
            if task.layout == "nhwc":
                w = w.permute(0, 2, 3, 1)
            new = TiledConv2d(cache.dir, keys[0], w.to(dtype).contiguous(),
                              None if b is None else b.to(dtype).contiguous())
        elif s.match.kind == "linear":
            new = TiledLinear(cache.dir, keys[0], module.weight.detach().t().to(dtype).contiguous(),
                              _detach(module.bias))
        elif s.match.kind == "attention":
            new = TiledSelfAttention(cache.dir, module, keys)
        else:
            new = None
        last = by_name[s.match.last]
        with gm.graph.inserting_after(last):
            if new is None:
                replacement = gm.graph.call_function(
                    torch.ops.tilesched.batch_matmul.default if task.op == "batch_matmul"
                    else torch.ops.tilesched.matmul.default,
                    (anchor.args[0], anchor.args[1], None, cache.dir, keys[0]))
            else:
                name = anchor.target.replace(".", "_") + "_tilesched"
                gm.add_submodule(name, new)
                replacement = gm.graph.call_module(name, anchor.args, anchor.kwargs)
        last.replace_all_uses_with(replacement)
        for name in reversed(s.match.nodes):
            gm.graph.erase_node(by_name[name])
        swapped.append((label, [k for k in keys if k]))
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    gm.tilesched_report = Report(swapped, left, others)
    return gm
