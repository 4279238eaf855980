"""The custom operators: a deploy cache's kernel on PyTorch tensors.

`torch.ops.tilesched.conv2d(x, weight, bias, cache, key)`,
`torch.ops.tilesched.matmul(a, b, bias, cache, key)` and
`torch.ops.tilesched.batch_matmul(a, b, bias, cache, key)` launch the kernel of task
`key` from the deploy cache in directory `cache`, on the GPU of the inputs and on
PyTorch's current stream, so that they order with PyTorch's work, are captured by CUDA
graphs, and appear in `torch.compile` graphs as one opaque call each (their fake
implementations give the output's shape, type and strides from the key).

What a kernel takes is exactly its task, and anything else is refused with one line
naming the parameter, never computed wrongly:

- conv2d, layout nchw: x `[N,C,H,W]` contiguous, weight `[K,C/G,R,S]` contiguous;
  layout nhwc: x `[N,C,H,W]` in channels_last memory format, weight `[K,R,S,C/G]`
  contiguous (KRSC); the output is `[N,K,P,Q]` in the same memory format as x;
- matmul: a `[M,K]`, b `[K,N]`, both contiguous (row-major); batch_matmul `[B,M,K]`,
  `[B,K,N]`;
- bias `[K]` or `[N]`, contiguous, when the key has `_bias` (None otherwise); every
  input of the task's element type; the output of its output type;
- all on one CUDA device, 16-byte aligned (a view into the middle of a tensor may not
  be: pass a copy).
"""

import functools
from typing import Optional

import torch
from torch import Tensor

from . import TileschedError, open_cache
from .keys import parse_key

TORCH_DTYPES = {"f32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                "bf16": torch.bfloat16}


class InputError(ValueError):
    """A tensor a kernel cannot take."""


@functools.lru_cache(maxsize=4096)
def task_of(key, op):
    task = parse_key(key)
    if task.op != op:
        raise InputError(f"tilesched.{op}: key {key} is a {task.op} task")
    return task


def expected_shapes(task):
    """The operand shapes of `task`: (data, weight, bias) as PyTorch sees them."""
    d = task.d
    if task.op == "conv2d":
        per_group = d["c"] // d["groups"]
        data = [d["n"], d["c"], d["h"], d["w"]]
        weight = ([d["k"], d["r"], d["s"], per_group] if task.layout == "nhwc"
                  else [d["k"], per_group, d["r"], d["s"]])
        return data, weight, [d["k"]]
    if task.op == "matmul":
        return [d["m"], d["k"]], [d["k"], d["n"]], [d["n"]]
    return [d["b"], d["m"], d["k"]], [d["b"], d["k"], d["n"]], [d["n"]]


def _check(op, task, key, x, weight, bias):
    """Refuses, in one line, operands that are not exactly the task's."""
    operands = _check_operands(op, task, key, x, weight, bias)
    device = x.device
    for name, t in operands:
        if t.device.type != "cuda" or t.device != device:
            raise InputError(f"tilesched.{op} {key}: {name} is on {t.device}, not on "
                             f"{device if device.type == 'cuda' else 'a CUDA device'}")


def _check_operands(op, task, key, x, weight, bias):
    """The operands' shapes, types and memory formats against the task's; returns them
    named."""
    dtype = TORCH_DTYPES[task.dtype]
    data_shape, weight_shape, bias_shape = expected_shapes(task)
    operands = [("input", x, data_shape), ("weight", weight, weight_shape)]
    if task.bias:
        if bias is None:
            raise InputError(f"tilesched.{op} {key}: the kernel adds a bias; none given")
        operands.append(("bias", bias, bias_shape))
    elif bias is not None:
        raise InputError(f"tilesched.{op} {key}: the kernel adds no bias; one given")
    for name, t, shape in operands:
        if t.dtype != dtype:
            raise InputError(f"tilesched.{op} {key}: {name} is {t.dtype}, the kernel takes {dtype}")
        if list(t.shape) != shape:
            raise InputError(f"tilesched.{op} {key}: {name} has shape {list(t.shape)}, "
                             f"the kernel takes {shape}")
        channels_last = name == "input" and task.op == "conv2d" and task.layout == "nhwc"
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        if not t.is_contiguous(memory_format=fmt):
            want = "channels_last" if channels_last else "contiguous (row-major)"
            raise InputError(f"tilesched.{op} {key}: {name} with strides {list(t.stride())} "
                             f"is not {want}; pass .contiguous("
                             f"{'memory_format=torch.channels_last' if channels_last else ''})")
    return [(name, t) for name, t, _ in operands]


def _output(task, x):
    shape = task.output_shape()
    fmt = torch.channels_last if task.op == "conv2d" and task.layout == "nhwc" else torch.contiguous_format
    return torch.empty(shape, dtype=TORCH_DTYPES[task.out_dtype], device=x.device, memory_format=fmt)


def _bytes(t):
    """The bytes from `t`'s first element to the end of its storage."""
    return t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()


def _run(op, x, weight, bias, cache, key):
    task = task_of(key, op)
    _check(op, task, key, x, weight, bias)
    out = _output(task, x)
    buffers = [x, weight] + ([bias] if bias is not None else []) + [out]
    with torch.cuda.device(x.device):
        kernel = _kernel(cache, x.device.index, key)
        try:
            kernel.launch([(t.data_ptr(), _bytes(t)) for t in buffers],
                          torch.cuda.current_stream(x.device).cuda_stream)
        except Exception as e:  # the native TileschedError: one line, our type
            raise TileschedError(f"tilesched.{op}: {e}") from None
    return out


@functools.lru_cache(maxsize=4096)
def _kernel(cache, device, key):
    try:
        return open_cache(cache, device).kernel(key)
    except TileschedError:
        raise
    except Exception as e:
        raise TileschedError(str(e)) from None


def _fake(op, x, weight, bias, key):
    task = task_of(key, op)
    data_shape, weight_shape, _ = expected_shapes(task)
    for name, t, shape in (("input", x, data_shape), ("weight", weight, weight_shape)):
        if list(t.shape) != shape:
            raise InputError(f"tilesched.{op} {key}: {name} has shape {list(t.shape)}, "
                             f"the kernel takes {shape}")
    return _output(task, x)


def _define(op, doc):
    """Registers `torch.ops.tilesched.<op>` and its fake implementation."""

    @torch.library.custom_op(f"tilesched::{op}", mutates_args=())
    def run(x: Tensor, weight: Tensor, bias: Optional[Tensor], cache: str, key: str) -> Tensor:
        return _run(op, x, weight, bias, cache, key)

    @run.register_fake
    def _(x, weight, bias, cache, key):
        return _fake(op, x, weight, bias, key)

    run.__doc__ = doc
    return run


conv2d = _define("conv2d", "The conv2d task `key`'s kernel from deploy cache `cache`.")
matmul = _define("matmul", "The matmul task `key`'s kernel: `a @ b (+ bias) (relu)`.")
batch_matmul = _define("batch_matmul", "The batch_matmul task `key`'s kernel: `a @ b` per batch (+ bias) (relu).")
