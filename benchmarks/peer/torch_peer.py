#!/usr/bin/env python3
"""PyTorch peer: tilesched's tuned kernels timed beside PyTorch eager and torch.compile.

tilesched's own benchmark compares its kernels with cuDNN and cuBLAS called directly.
What a user would otherwise run is PyTorch, whose eager mode adds its own algorithm
choice (cudnn.benchmark, cuBLASLt epilogues) and whose `torch.compile` may generate
Triton kernels of its own. This script answers "is the tuned kernel faster than what I
already have in PyTorch?" in one process, on one GPU, on the same buffers:

- our kernels come from a deploy cache (`--deploy DIR`, its `index.json`) or from
  `tilesched export --format cubin` sidecars (`--export FILE.json ...`); each cubin is
  loaded with the CUDA driver API (ctypes on libcuda) into PyTorch's own context and
  launched on PyTorch's current stream, so PyTorch tensors are its buffers and its
  launches can be captured in a CUDA graph like any PyTorch work; a kernel takes one
  device pointer per buffer (inputs, bias if any, output), then, where its launch says
  so, a pointer to a workspace (`workspace_bytes`, zeroed once per loaded kernel) and
  one 128-byte TMA tensor map by value per `tensor_maps` entry (tiled, or im2col for
  a convolution's activations; the `wgmma` sketch's
  sm_90a kernels), encoded for each buffer set's own buffers; a kernel whose launch has
  a thread block `cluster` other than [1, 1, 1] is launched with cuLaunchKernelEx, the
  cluster dimension its launch attribute;
- eager is PyTorch at its strongest: `cudnn.benchmark` times every cuDNN configuration
  (`--cudnn-benchmark-limit 0`), and because it times them warm, three samples each,
  its choice varies from process to process (on an H100, up to 1.7x on one resnet layer);
  so a convolution's eager side is `--eager-picks` choices made afresh on as many threads
  (PyTorch keeps its cuDNN plans per thread), and each protocol keeps the fastest, as
  tilesched's bench keeps the vendor's fastest candidate. The first pick, what one
  process would run, is reported too;
- every output is checked exactly: inputs are small integers chosen so that every
  partial sum is an integer exact in every type involved, and our output must equal a
  float64 reference bit for bit (PyTorch's own error is recorded, not judged);
- every side is timed under two protocols: `cold` (tilesched's bench protocol: rotated
  buffer copies so that L2 starts cold, one pair of events per call, a GPU busy-wait
  before each batch so that host launch latency never lands in a sample, sides
  interleaved over rounds) and `warm` (40 back-to-back calls on one buffer set in a CUDA
  graph: warm L2, no host overhead at all, the best case for everyone).

It writes OUT/peer.json and OUT/peer.md and prints the markdown.

    python3 benchmarks/peer/torch_peer.py --deploy deploy-cache --out peer-out
    python3 benchmarks/peer/torch_peer.py --export k.cubin.json --out peer-out --no-compile

Exit status: 0 when every kernel was exact, 1 when one was wrong or failed (the report is
still written), 2 with one line on stderr for bad arguments, unreadable inputs, or no
torch / no CUDA.

The pure parts (task parsing, shapes, the value rule, tensor map arguments, rotation
sizing, statistics, markdown) import without torch, so that they can be tested on any
machine (test_torch_peer.py beside this file); torch is imported inside `main`.
"""

import argparse
import ctypes
import dataclasses
import datetime
import gc
import hashlib
import json
import math
import os
import queue
import signal
import sys
import threading
import time
import warnings

PROG = "torch_peer"

# --------------------------------------------------------------------------------------
# Tasks (mirrors schedule/src/task.rs: Task, Operator, Conv2d, Epilogue, DType, Layout)
# --------------------------------------------------------------------------------------

DTYPES = ("f32", "tf32", "fp16", "bf16")
LAYOUTS = ("nchw", "nhwc")
ELEMENT_BYTES = {"f32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
# Largest integer magnitude below which every integer is exact in the type: 2^24 for
# f32 (and TF32 data, stored and accumulated as f32), 2^11 for fp16, 2^8 for bf16.
EXACT_LIMIT = {"f32": 1 << 24, "tf32": 1 << 24, "fp16": 2048, "bf16": 256}
CONV_FIELDS = ("n", "c", "h", "w", "k", "r", "s", "stride_h", "stride_w", "pad_h",
               "pad_w", "dilation_h", "dilation_w")
# Fields that must be at least 1 (pads may be 0).
CONV_POSITIVE = ("n", "c", "h", "w", "k", "r", "s", "stride_h", "stride_w",
                 "dilation_h", "dilation_w")
MATMUL_FIELDS = {"matmul": ("m", "n", "k"), "batch_matmul": ("b", "m", "n", "k")}


class TaskError(ValueError):
    """A Task JSON that is malformed or describes an impossible shape."""


@dataclasses.dataclass
class Task:
    """One tuning task, as tilesched's Task JSON describes it."""

    op: str  # "conv2d", "matmul" or "batch_matmul"
    dims: dict  # the operator's integer fields (conv: CONV_FIELDS; matmul: m, n, k; ...)
    # conv2d only: end pads as recorded (None: same as the start pad) and groups.
    pad_bottom: object = None
    pad_right: object = None
    groups: int = 1
    bias: bool = False
    relu: bool = False
    dtype: str = "f32"
    out_dtype: str = "f32"
    layout: str = "nchw"

    def __getattr__(self, name):
        # Shape fields read as attributes (task.c, task.stride_h, task.m ...).
        dims = self.__dict__.get("dims", {})
        if name in dims:
            return dims[name]
        raise AttributeError(name)


def _uint(obj, name, minimum, where):
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TaskError(f"{where}: field {name!r} must be an integer, got {value!r}")
    if value < minimum:
        raise TaskError(f"{where}: field {name!r} must be at least {minimum}, got {value}")
    return value


def parse_task(obj, where="task"):
    """The Task of a Task JSON object (serde's flattened form, with its defaults:
    no epilogue = no bias and no relu, dtype/out_dtype f32, layout nchw, groups 1)."""
    if not isinstance(obj, dict):
        raise TaskError(f"{where}: a task is a JSON object, got {type(obj).__name__}")
    op = obj.get("op")
    if op == "conv2d":
        dims = {f: _uint(obj, f, 1 if f in CONV_POSITIVE else 0, where) for f in CONV_FIELDS}
        ends = {}
        for name in ("pad_bottom", "pad_right"):
            ends[name] = None if obj.get(name) is None else _uint(obj, name, 0, where)
        groups = 1 if obj.get("groups") is None else _uint(obj, "groups", 1, where)
    elif op in MATMUL_FIELDS:
        dims = {f: _uint(obj, f, 1, where) for f in MATMUL_FIELDS[op]}
        ends = {"pad_bottom": None, "pad_right": None}
        groups = 1
    else:
        raise TaskError(f"{where}: unknown op {op!r} (conv2d, matmul, batch_matmul)")
    epilogue = obj.get("epilogue") or {}
    if not isinstance(epilogue, dict):
        raise TaskError(f"{where}: epilogue must be an object, got {epilogue!r}")
    dtype = obj.get("dtype") or "f32"
    out_dtype = obj.get("out_dtype") or "f32"
    layout = obj.get("layout") or "nchw"
    for name, value, allowed in (("dtype", dtype, DTYPES), ("out_dtype", out_dtype, DTYPES),
                                 ("layout", layout, LAYOUTS)):
        if value not in allowed:
            raise TaskError(f"{where}: {name} {value!r} is not one of {', '.join(allowed)}")
    if out_dtype not in ("f32", dtype):
        raise TaskError(f"{where}: the output type must be f32 or the input type {dtype}, "
                        f"not {out_dtype}")
    if layout != "nchw" and op != "conv2d":
        raise TaskError(f"{where}: the {layout} layout applies to conv2d only")
    task = Task(op=op, dims=dims, groups=groups, bias=bool(epilogue.get("bias", False)),
                relu=bool(epilogue.get("relu", False)), dtype=dtype, out_dtype=out_dtype,
                layout=layout, **ends)
    if op == "conv2d":
        if task.c % groups or task.k % groups:
            raise TaskError(f"{where}: groups {groups} must divide both the input channels "
                            f"{task.c} and the output channels {task.k}")
        conv_output_size(task)  # raises on an empty output
    return task


def pad_end(task):
    """Bottom and right padding (the start pads unless recorded otherwise)."""
    bottom = task.pad_h if task.pad_bottom is None else task.pad_bottom
    right = task.pad_w if task.pad_right is None else task.pad_right
    return bottom, right


def conv_output_size(task):
    """Output height and width P, Q of a conv2d (as Conv2d::output_size)."""
    bottom, right = pad_end(task)

    def dim(size, pad, end, dilation, kernel, stride):
        span = dilation * (kernel - 1) + 1
        padded = size + pad + end
        if padded < span:
            raise TaskError(f"the convolution output is empty: the kernel spans {span} but "
                            f"the padded input is only {padded}")
        return (padded - span) // stride + 1

    return (dim(task.h, task.pad_h, bottom, task.dilation_h, task.r, task.stride_h),
            dim(task.w, task.pad_w, right, task.dilation_w, task.s, task.stride_w))


def asymmetric_padding(task):
    """True when a conv2d's end pads differ from its start pads."""
    return task.op == "conv2d" and pad_end(task) != (task.pad_h, task.pad_w)


def task_key(task):
    """The task's key, as Task::key writes it (e.g. conv2d_n1_c64_..._st1_p1_fp16_nhwc)."""

    def pair(a, b):
        return str(a) if a == b else f"{a}x{b}"

    if task.op == "conv2d":
        key = (f"conv2d_n{task.n}_c{task.c}_h{task.h}_w{task.w}_k{task.k}_r{task.r}"
               f"_s{task.s}_st{pair(task.stride_h, task.stride_w)}"
               f"_p{pair(task.pad_h, task.pad_w)}")
        if task.pad_bottom is not None or task.pad_right is not None:
            key += "_pe" + pair(*pad_end(task))
        if (task.dilation_h, task.dilation_w) != (1, 1):
            key += "_d" + pair(task.dilation_h, task.dilation_w)
        if task.groups != 1:
            key += f"_g{task.groups}"
    elif task.op == "matmul":
        key = f"matmul_m{task.m}_n{task.n}_k{task.k}"
    else:
        key = f"batch_matmul_b{task.b}_m{task.m}_n{task.n}_k{task.k}"
    if task.bias:
        key += "_bias"
    if task.relu:
        key += "_relu"
    if task.dtype != "f32":
        key += f"_{task.dtype}"
    if task.out_dtype != "f32":
        key += f"_out_{task.out_dtype}"
    if task.layout != "nchw":
        key += f"_{task.layout}"
    return key


def reduction_length(task):
    """Products summed into each output element."""
    if task.op == "conv2d":
        return task.c // task.groups * task.r * task.s
    return task.k


def output_features(task):
    """Length of the bias vector: conv2d's output channels K, a matmul's columns N."""
    return task.k if task.op == "conv2d" else task.n


def flops(task):
    """Two per multiply-add (the epilogue is not counted), as Task::flops."""
    return 2 * math.prod(buffer_specs(task)[-1].logical_shape) * reduction_length(task)


@dataclasses.dataclass(frozen=True)
class BufferSpec:
    """One kernel parameter's buffer. `logical_shape` is the shape of the PyTorch
    tensor (NCHW order for conv2d); `channels_last` says the kernel's row-major layout
    is that tensor's channels_last storage (NHWC data and output, KRSC weights)."""

    role: str  # "input", "weight", "bias" or "output", in kernel parameter order
    logical_shape: tuple
    channels_last: bool
    dtype: str

    @property
    def elements(self):
        return math.prod(self.logical_shape)

    @property
    def bytes(self):
        return self.elements * ELEMENT_BYTES[self.dtype]

    @property
    def storage_shape(self):
        """The row-major shape the kernel indexes."""
        if self.channels_last:
            n, c, h, w = self.logical_shape
            return (n, h, w, c)
        return self.logical_shape


def buffer_specs(task):
    """The kernel's buffers in parameter order: input, weight, bias (only with a bias
    epilogue; in the input type), output (in the output type)."""
    nhwc = task.layout == "nhwc"
    if task.op == "conv2d":
        p, q = conv_output_size(task)
        shapes = [(task.n, task.c, task.h, task.w),
                  (task.k, task.c // task.groups, task.r, task.s),
                  (task.n, task.k, p, q)]
    elif task.op == "matmul":
        shapes = [(task.m, task.k), (task.k, task.n), (task.m, task.n)]
    else:
        shapes = [(task.b, task.m, task.k), (task.b, task.k, task.n), (task.b, task.m, task.n)]
    specs = [BufferSpec("input", shapes[0], nhwc, task.dtype),
             BufferSpec("weight", shapes[1], nhwc, task.dtype)]
    if task.bias:
        specs.append(BufferSpec("bias", (output_features(task),), False, task.dtype))
    specs.append(BufferSpec("output", shapes[2], nhwc, task.out_dtype))
    return specs


def set_bytes(task):
    """Bytes of one buffer set (inputs, bias, output)."""
    return sum(spec.bytes for spec in buffer_specs(task))


# --------------------------------------------------------------------------------------
# TMA tensor maps (mirrors schedule/src/atom/tma.rs TensorBox and its rules,
# schedule/src/launch.rs TensorMapArg, gpu/src/tensor_map.rs encode)
# --------------------------------------------------------------------------------------

TMA_MAX_RANK = 5
TMA_MAX_BOX = 256  # elements of a box along one dimension
TMA_ALIGNMENT = 16  # bytes: global addresses, strides, a box's inner extent
# Swizzle as serde writes it (snake_case of schedule::atom::wgmma::Swizzle) -> the span
# of one swizzled row in bytes (None: no swizzle, no limit).
SWIZZLE_SPAN = {"none": None, "b32": 32, "b64": 64, "b128": 128}
# The driver's enum values (cuda.h; cudarc's driver::sys), chosen as
# gpu/src/tensor_map.rs chooses them. Data types: FLOAT32, TFLOAT32, FLOAT16, BFLOAT16.
CU_TENSOR_MAP_DATA_TYPE = {"f32": 7, "tf32": 11, "fp16": 6, "bf16": 9}
CU_TENSOR_MAP_SWIZZLE = {"none": 0, "b32": 1, "b64": 2, "b128": 3}  # NONE, 32B, 64B, 128B
CU_TENSOR_MAP_INTERLEAVE_NONE = 0
CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0  # out-of-bounds elements read as zeros
TMA_MAX_IM2COL_PIXELS = 256  # rows of an im2col box (schedule's MAX_IM2COL_PIXELS)
# The bounding box corners' range by rank: 16 bits shared by the spatial dimensions.
IM2COL_CORNERS = {3: (-(1 << 15), (1 << 15) - 1), 4: (-(1 << 7), (1 << 7) - 1),
                  5: (-(1 << 4), (1 << 4) - 1)}
TENSOR_MAP_BYTES = 128  # a CUtensorMap: 16 opaque 64-bit words, passed by value
TENSOR_MAP_ALIGN = 64


@dataclasses.dataclass(frozen=True)
class TensorMapArg:
    """A kernel parameter after the buffers (and workspace): the tensor map of buffer
    `buffer` (its index among the kernel's buffer parameters, inputs first), encoded
    from `tensor` (a checked TensorBox JSON object) and that buffer's address."""

    buffer: int
    tensor: dict


def _uint_list(value, name, where):
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ValueError(f"{where}: {name} {value!r} is not a list of non-negative integers")
    return tuple(value)


def parse_tensor_box(obj, where="tensor box"):
    """A TensorBox JSON object, checked against TMA's rules as TensorBox::check checks
    it: {"dtype", "dims" (innermost first, elements), "strides" (bytes, every dimension
    but the innermost), "boxed" (elements), "swizzle"}. Returns a normalized copy
    (tuples); a malformed box is a ValueError."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a tensor box is a JSON object, got {obj!r}")
    dtype, swizzle = obj.get("dtype"), obj.get("swizzle")
    if dtype not in CU_TENSOR_MAP_DATA_TYPE:
        raise ValueError(f"{where}: dtype {dtype!r} is not one of {DTYPES}")
    if swizzle not in SWIZZLE_SPAN:
        raise ValueError(f"{where}: swizzle {swizzle!r} is not one of {tuple(SWIZZLE_SPAN)}")
    dims = _uint_list(obj.get("dims"), "dims", where)
    strides = _uint_list(obj.get("strides"), "strides", where)
    boxed = _uint_list(obj.get("boxed"), "boxed", where)
    rank = len(dims)
    im2col = obj.get("im2col")
    if im2col is None:
        if not 1 <= rank <= TMA_MAX_RANK or len(boxed) != rank or len(strides) + 1 != rank:
            raise ValueError(f"{where}: a tensor map has 1 to {TMA_MAX_RANK} dimensions with "
                             f"one box extent each and one stride fewer, got dims "
                             f"{list(dims)}, strides {list(strides)}, boxed {list(boxed)}")
    else:
        im2col = parse_im2col(im2col, rank, where)
        if len(boxed) != 2 or len(strides) + 1 != rank:
            raise ValueError(f"{where}: an im2col map's box is [channels, pixels] and its "
                             f"strides one fewer than its dimensions, got boxed "
                             f"{list(boxed)}, strides {list(strides)}")
        if boxed[1] > TMA_MAX_IM2COL_PIXELS:
            raise ValueError(f"{where}: {boxed[1]} pixels per im2col box, above "
                             f"{TMA_MAX_IM2COL_PIXELS}")
    for dim, extent in enumerate(dims):
        if not 1 <= extent <= 1 << 32:
            raise ValueError(f"{where}: extent {extent} of dimension {dim} is 0 or above 2^32")
    for dim, stride in enumerate(strides, start=1):
        if stride % TMA_ALIGNMENT or stride >= 1 << 40:
            raise ValueError(f"{where}: stride {stride} bytes of dimension {dim} is not a "
                             "multiple of 16 (or is 2^40 or more)")
    for dim, extent in enumerate(boxed):
        if not 1 <= extent <= TMA_MAX_BOX:
            raise ValueError(f"{where}: box extent {extent} of dimension {dim} is 0 or "
                             f"above {TMA_MAX_BOX}")
    inner = boxed[0] * ELEMENT_BYTES[dtype]
    span = SWIZZLE_SPAN[swizzle]
    if inner % TMA_ALIGNMENT or (span is not None and inner > span):
        raise ValueError(f"{where}: the box's inner extent is {inner} bytes: not a multiple "
                         f"of 16, or wider than its swizzle {swizzle}")
    out = {"dtype": dtype, "dims": dims, "strides": strides, "boxed": boxed,
           "swizzle": swizzle}
    if im2col is not None:
        out["im2col"] = im2col
    return out


def parse_im2col(obj, rank, where):
    """The im2col mode of a TensorBox (schedule/src/atom/tma.rs Im2col): per spatial
    dimension, innermost first, the bounding box's "lower" and "upper" corners (signed,
    within the rank's range) and the "traversal" stride (1 to 8), for a tensor of rank
    3 to 5. Returns a normalized copy (tuples); a malformed one is a ValueError."""
    if not isinstance(obj, dict) or not 3 <= rank <= TMA_MAX_RANK:
        raise ValueError(f"{where}: im2col {obj!r} is not an im2col mode of a tensor of "
                         f"rank 3 to {TMA_MAX_RANK}")
    low, high = IM2COL_CORNERS[rank]
    out = {}
    for name in ("lower", "upper"):
        corner = obj.get(name)
        if not isinstance(corner, (list, tuple)) or len(corner) != rank - 2 or not all(
                isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
                for v in corner):
            raise ValueError(f"{where}: im2col {name} corner {corner!r} is not {rank - 2} "
                             f"integers in [{low}, {high}]")
        out[name] = tuple(corner)
    traversal = _uint_list(obj.get("traversal"), "traversal", where)
    if len(traversal) != rank - 2 or not all(1 <= t <= 8 for t in traversal):
        raise ValueError(f"{where}: im2col traversal {list(traversal)} is not {rank - 2} "
                         "strides of 1 to 8")
    out["traversal"] = traversal
    return out


def parse_tensor_maps(value, buffers, where):
    """The `tensor_maps` of a launch (absent or None: none) for a kernel of `buffers`
    buffer parameters: a tuple of TensorMapArg; a malformed list is a ValueError."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"{where}: tensor_maps {value!r} is not a list")
    maps = []
    for i, entry in enumerate(value):
        at = f"{where}: tensor map {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} is not a JSON object")
        buffer = entry.get("buffer")
        if isinstance(buffer, bool) or not isinstance(buffer, int) or \
                not 0 <= buffer < buffers:
            raise ValueError(f"{at}: buffer {buffer!r} is not the index of one of the "
                             f"kernel's {buffers} buffers")
        maps.append(TensorMapArg(buffer, parse_tensor_box(entry.get("tensor"), at)))
    return tuple(maps)


def _check_address(address):
    if isinstance(address, bool) or not isinstance(address, int) or address <= 0 \
            or address % TMA_ALIGNMENT:
        raise ValueError(f"tensor map address {address!r} is not a device address "
                         f"aligned to {TMA_ALIGNMENT} bytes")


def tensor_map_encode_args(tensor, address):
    """The arguments of cuTensorMapEncodeTiled after its first (the map written) for
    the TensorBox JSON `tensor` at device address `address`, as gpu/src/tensor_map.rs
    passes them: (data type, rank, global address, dims, strides, box dims, element
    strides (all 1), interleave none, swizzle, L2 promotion 128B, OOB fill none).
    Sequences are tuples of ints; a malformed box or a misaligned address is a
    ValueError."""
    tensor = parse_tensor_box(tensor)
    _check_address(address)
    rank = len(tensor["dims"])
    return (CU_TENSOR_MAP_DATA_TYPE[tensor["dtype"]], rank, address, tensor["dims"],
            tensor["strides"], tensor["boxed"], (1,) * rank, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE[tensor["swizzle"]], CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)


def tensor_map_im2col_encode_args(tensor, address):
    """The arguments of cuTensorMapEncodeIm2col after its first for the im2col
    TensorBox JSON `tensor` at `address`, as gpu/src/tensor_map.rs passes them: (data
    type, rank, global address, dims, strides, lower corner, upper corner, channels per
    pixel, pixels per column, element strides (1, the traversal, 1), interleave none,
    swizzle, L2 promotion 128B, OOB fill none)."""
    tensor = parse_tensor_box(tensor)
    im2col = tensor.get("im2col")
    if im2col is None:
        raise ValueError("not an im2col tensor map")
    _check_address(address)
    rank = len(tensor["dims"])
    return (CU_TENSOR_MAP_DATA_TYPE[tensor["dtype"]], rank, address, tensor["dims"], tensor["strides"], im2col["lower"],
            im2col["upper"], tensor["boxed"][0], tensor["boxed"][1],
            (1,) + im2col["traversal"] + (1,), CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE[tensor["swizzle"]], CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)


# --------------------------------------------------------------------------------------
# Exact values
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ValuePlan:
    """How a task's inputs are drawn so that every result is exact.

    Inputs, weights and bias are integers in [-magnitude, magnitude]. With
    `weight_nonzeros` set, each output's row of weights (its C/g*R*S or K reduction
    entries) holds exactly that many non-zeros, so that no dot product has more non-zero
    terms. `worst_case` bounds |any partial sum + bias| analytically and is below
    `limit`, the magnitude under which every integer is exact in each type the
    computation passes through (PyTorch's eager output is in the input type, so half
    inputs bound the sums by their own type even with an f32 output)."""

    magnitude: int
    weight_nonzeros: object  # int, or None for dense weights
    worst_case: int
    limit: int


def value_plan(reduction, dtype, out_dtype, bias):
    """The value rule for a reduction of `reduction` products: the largest dense range
    in {2, 1} whose worst case stays below the limit, else {-1, 0, 1} with the weights
    made sparse (a fixed count of non-zeros per output)."""
    limit = min(EXACT_LIMIT[dtype], EXACT_LIMIT[out_dtype])
    for magnitude in (2, 1):
        worst = reduction * magnitude * magnitude + (magnitude if bias else 0)
        if worst < limit:
            return ValuePlan(magnitude, None, worst, limit)
    nonzeros = limit - 1 - (1 if bias else 0)
    plan = ValuePlan(1, nonzeros, nonzeros + (1 if bias else 0), limit)
    assert 1 <= plan.weight_nonzeros < reduction and plan.worst_case < limit, plan
    return plan


# --------------------------------------------------------------------------------------
# Inputs: deploy caches, export sidecars, counts
# --------------------------------------------------------------------------------------


class InputError(Exception):
    """An argument or input file that makes the run impossible (exit status 2)."""


@dataclasses.dataclass
class Launch:
    grid: tuple
    block: tuple
    dynamic_shared_bytes: int
    zero_output: bool
    # Bytes of scratch the kernel takes as its parameter after the buffers (0: none),
    # zeroed once before the first launch; every launch leaves it zeroed.
    workspace_bytes: int = 0
    # TensorMapArg per 128-byte tensor map parameter after that, in parameter order.
    tensor_maps: tuple = ()
    # Blocks per thread block cluster, (x, y, z); each grid dimension is a multiple of
    # its own. (1, 1, 1): no clusters, launched with cuLaunchKernel; otherwise with
    # cuLaunchKernelEx and the cluster dimension as a launch attribute.
    cluster: tuple = (1, 1, 1)


@dataclasses.dataclass
class Candidate:
    """One kernel to compare: its task, cubin image and launch."""

    key: str
    task: Task
    kernel: str
    launch: Launch
    image: bytes
    image_path: str
    source: str  # where it came from, for the report
    tuned_us: object  # the time tuning recorded, µs (None when unknown)
    # Deploy entries name the GPU they were tuned on; sidecars name a device and arch.
    gpu: object = None
    compute_capability: object = None
    notes: list = dataclasses.field(default_factory=list)


def _read_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{what} {path} is not valid JSON: {e}") from None


def _read_bytes(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror or e}") from None


def _uint_field(obj, name, where):
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {name} must be a non-negative integer, got {value!r}")
    return value


def _dim3(value, name, where):
    """An extent as tilesched writes it: a positive number (one dimension) or [x, y, z]."""
    def positive(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1
    if positive(value):
        return (value, 1, 1)
    if isinstance(value, list) and len(value) == 3 and all(positive(v) for v in value):
        return tuple(value)
    raise ValueError(f"{where}: {name} {value!r} is not a positive number or [x, y, z]")


def _cluster(launch, grid, where):
    """The blocks per thread block cluster of a launch object (a deploy entry's
    `launch`, or an export sidecar), as `_dim3` reads it: (1, 1, 1) when absent. A
    cluster must divide the grid `grid` in each dimension."""
    value = launch.get("cluster")
    if value is None:
        return (1, 1, 1)
    cluster = _dim3(value, "cluster", where)
    if any(g % c for g, c in zip(grid, cluster)):
        raise ValueError(f"{where}: cluster {list(cluster)} does not divide grid "
                         f"{list(grid)} in every dimension")
    return cluster


def _launch_extras(launch, task, where):
    """(workspace_bytes, tensor_maps) of a launch object (a deploy entry's `launch`, or
    an export sidecar, where they are flattened in): both left out when there are
    none."""
    workspace = 0 if "workspace_bytes" not in launch else \
        _uint_field(launch, "workspace_bytes", where)
    maps = parse_tensor_maps(launch.get("tensor_maps"), len(buffer_specs(task)), where)
    return workspace, maps


def _task_of(shape, key, where):
    """The Task of a recorded shape whose key must be `key` (as runtime::params_of)."""
    task = parse_task(shape, where)
    if task_key(task) != key:
        raise TaskError(f"its shape is task {task_key(task)}, not {key}")
    return task


def load_deploy(directory):
    """The entries of the deploy cache in `directory`: (candidates, skipped), where
    skipped lists {"task", "source", "reason"} for entries that cannot be launched
    (no recorded shape, a missing or altered cubin). An unreadable or malformed index
    is an InputError."""
    index_path = os.path.join(directory, "index.json")
    index = _read_json(index_path, "deploy index")
    entries = index.get("entries") if isinstance(index, dict) else None
    if not isinstance(entries, list):
        raise InputError(f"deploy index {index_path} has no 'entries' list")
    candidates, skipped = [], []
    for i, entry in enumerate(entries):
        where = f"{index_path} entry {i}"
        key = entry.get("task") if isinstance(entry, dict) else None
        source = f"deploy:{directory}"

        def skip(reason, key=key):
            skipped.append({"task": key or f"entry {i}", "source": source, "reason": reason})

        if not isinstance(key, str):
            skip("the entry has no task key")
            continue
        if entry.get("shape") is None:
            skip("no task shape (written by an older tilesched); store the kernel again")
            continue
        try:
            task = _task_of(entry["shape"], key, where)
            launch = entry.get("launch") or {}
            grid = _dim3(launch.get("grid"), "grid", where)
            launch = Launch(grid,
                            (_uint_field(launch, "block", where), 1, 1),
                            _uint_field(launch, "dynamic_shared_bytes", where),
                            bool(launch.get("zero_output", False)),
                            *_launch_extras(launch, task, where),
                            cluster=_cluster(launch, grid, where))
            kernel, cubin = entry.get("kernel"), entry.get("cubin")
            if not isinstance(kernel, str) or not isinstance(cubin, str):
                raise ValueError("the entry lacks its kernel name or cubin path")
            cc = entry.get("compute_capability")
            if not (isinstance(cc, list) and len(cc) == 2):
                raise ValueError(f"compute_capability {cc!r} is not [major, minor]")
        except (TaskError, ValueError) as e:
            skip(f"malformed entry: {e}")
            continue
        path = os.path.join(directory, cubin)
        try:
            image = _read_bytes(path, "cubin")
        except InputError as e:
            skip(str(e))
            continue
        digest = hashlib.sha256(image).hexdigest()
        if digest != str(entry.get("sha256", "")).lower():
            skip(f"cubin {path} does not match its sha256 (altered or replaced)")
            continue
        candidates.append(Candidate(
            key=key, task=task, kernel=kernel, launch=launch, image=image, image_path=path,
            source=source, tuned_us=entry.get("final_us"), gpu=entry.get("gpu"),
            compute_capability=tuple(cc)))
    return candidates, skipped


def load_export(sidecar_path):
    """The kernel of one `tilesched export --format cubin` sidecar (PATH.json beside
    the cubin PATH): (candidate or None, skipped list). An unreadable sidecar or cubin,
    or a malformed sidecar, is an InputError; a sidecar without a task shape (an older
    exporter) is skipped."""
    sidecar = _read_json(sidecar_path, "export sidecar")
    source = f"export:{sidecar_path}"
    if not isinstance(sidecar, dict) or not isinstance(sidecar.get("task"), str):
        raise InputError(f"export sidecar {sidecar_path} has no task key")
    key = sidecar["task"]
    if not sidecar_path.endswith(".json"):
        raise InputError(f"export sidecar {sidecar_path} does not end in .json, so its "
                         "cubin path (the sidecar's without .json) is unknown")
    if sidecar.get("format", "cubin") not in ("cubin", "ptx"):
        return None, [{"task": key, "source": source,
                       "reason": f"exported as {sidecar.get('format')}, not a cubin"}]
    if sidecar.get("shape") is None:
        return None, [{"task": key, "source": source,
                       "reason": "the sidecar has no task shape (exported by an older "
                                 "tilesched); export it again"}]
    try:
        task = _task_of(sidecar["shape"], key, sidecar_path)
        for name in ("dtype", "out_dtype", "layout"):
            if name in sidecar and sidecar[name] != getattr(task, name):
                raise TaskError(f"its {name} {sidecar[name]!r} contradicts its shape's "
                                f"{getattr(task, name)!r}")
        dims = []
        for name in ("grid", "block"):
            value = sidecar.get(name)
            if not (isinstance(value, list) and len(value) == 3
                    and all(isinstance(v, int) and v >= 1 for v in value)):
                raise ValueError(f"{name} {value!r} is not [x, y, z]")
            dims.append(tuple(value))
        launch = Launch(dims[0], dims[1],
                        _uint_field(sidecar, "dynamic_shared_bytes", sidecar_path),
                        bool(sidecar.get("zero_output", False)),
                        *_launch_extras(sidecar, task, sidecar_path),
                        cluster=_cluster(sidecar, dims[0], sidecar_path))
        if not isinstance(sidecar.get("kernel"), str):
            raise ValueError("no kernel name")
    except (TaskError, ValueError) as e:
        raise InputError(f"export sidecar {sidecar_path}: {e}") from None
    cubin_path = sidecar_path[: -len(".json")]
    image = _read_bytes(cubin_path, "cubin")
    if sidecar.get("format") == "ptx":
        image += b"\0"  # the driver reads PTX as a NUL-terminated string
    arch = sidecar.get("arch")
    cc = None
    if isinstance(arch, str) and arch.endswith("a"):
        arch = arch[:-1]  # sm_90a (target arch_specific) runs on sm_90 alone
    if isinstance(arch, str) and arch.startswith("sm_") and arch[3:].isdigit():
        cc = (int(arch[3:-1]), int(arch[-1]))
    return Candidate(key=key, task=task, kernel=sidecar["kernel"], launch=launch,
                     image=image, image_path=cubin_path, source=source,
                     tuned_us=sidecar.get("median_us"), gpu=sidecar.get("device"),
                     compute_capability=cc), []


def load_counts(path):
    """{task key: count} from --counts (None: every count is 1)."""
    if path is None:
        return {}
    counts = _read_json(path, "counts file")
    if not isinstance(counts, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for v in counts.values()):
        raise InputError(f"counts file {path} must map task keys to non-negative numbers")
    return counts


def select_for_device(candidates, gpu, capability):
    """Splits candidates into those tuned for this GPU and skipped ones: a deploy
    entry must name this GPU and compute capability (a kernel is launched only on the
    GPU model it was measured on); a sidecar must be for this architecture, and one
    measured on another GPU model is kept with a note."""
    kept, skipped = [], []
    for c in candidates:
        if c.source.startswith("deploy:"):
            if c.gpu != gpu or tuple(c.compute_capability) != tuple(capability):
                skipped.append({"task": c.key, "source": c.source,
                                "reason": f"tuned for {c.gpu} (sm_{c.compute_capability[0]}"
                                          f"{c.compute_capability[1]}), not this GPU"})
                continue
        else:
            if c.compute_capability is not None and \
                    tuple(c.compute_capability) != tuple(capability):
                skipped.append({"task": c.key, "source": c.source,
                                "reason": "built for sm_%d%d, this GPU is sm_%d%d"
                                          % (*c.compute_capability, *capability)})
                continue
            if c.gpu is not None and c.gpu != gpu:
                c.notes.append(f"tuned on {c.gpu}, not on this GPU")
        kept.append(c)
    return kept, skipped


def choose_tasks(candidates, substring, limit):
    """Candidates whose key contains `substring`, first of each key, at most `limit`:
    (chosen, skipped duplicates)."""
    chosen, skipped, seen = [], [], {}
    for c in candidates:
        if substring and substring not in c.key:
            continue
        if c.key in seen:
            skipped.append({"task": c.key, "source": c.source,
                            "reason": f"duplicate of the kernel from {seen[c.key]}"})
            continue
        if limit is not None and len(chosen) >= limit:
            continue
        seen[c.key] = c.source
        chosen.append(c)
    return chosen, skipped


# --------------------------------------------------------------------------------------
# Protocol arithmetic
# --------------------------------------------------------------------------------------

MAX_COPIES = 1000
MAX_BATCH = 256
MAX_SPIN_US = 20_000.0
WARMUP_CALLS = 3
GRAPH_CALLS = 40
GRAPH_WARMUP_REPLAYS = 3
GRAPH_TIMED_REPLAYS = 15


def copies_per_rotation(one_set_bytes, l2_bytes, free_bytes, cap=MAX_COPIES):
    """Buffer sets to rotate through: enough that one rotation touches more than twice
    the L2 (so no call finds its inputs there), at most `cap`, and within a quarter of
    the free memory; if even two sets exceed that budget, one."""
    one_set_bytes = max(1, one_set_bytes)
    copies = min(2 * l2_bytes // one_set_bytes + 1, cap)
    budget = free_bytes // 4
    if copies * one_set_bytes > budget:
        copies = budget // one_set_bytes
        if copies < 2:
            copies = 1
    return max(1, copies)


def median(samples):
    """The median (the mean of the middle two for an even count); NaN when empty."""
    if not samples:
        return float("nan")
    s = sorted(samples)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def percentile(samples, q):
    """The q-th percentile (0..100), linear between order statistics; NaN when empty."""
    if not samples:
        return float("nan")
    s = sorted(samples)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def geomean(values):
    """Geometric mean of positive values; None when there are none."""
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def next_batch(samples, min_time_us, min_repeats, max_repeats):
    """Calls the next timed batch should hold: aimed at what is left of the time and
    count targets, between 1 and MAX_BATCH, never past max_repeats."""
    taken = len(samples)
    left = max(0, max_repeats - taken)
    if taken == 0:
        wanted = max(1, min_repeats)
    else:
        estimate = max(median(samples), 0.5)
        time_left = max(0.0, min_time_us - sum(samples))
        wanted = max(math.ceil(time_left / estimate), min_repeats - taken)
    return min(max(wanted, 1), MAX_BATCH, max(left, 1))


def enough(samples, min_time_us, min_repeats, max_repeats):
    """True once the samples reach both targets, or the cap."""
    return len(samples) >= max_repeats or (
        len(samples) >= min_repeats and sum(samples) >= min_time_us)


def spin_us(batch, enqueue_us):
    """How long the GPU should busy-wait before a batch so that the host has enqueued
    all of it before the first call runs (a quarter more for jitter, plus a margin)."""
    return min(batch * max(enqueue_us, 0.0) * 1.25 + 20.0, MAX_SPIN_US)


def batch_cap_for_spin(enqueue_us):
    """Most calls one batch may hold so that the longest spin still covers their
    enqueue: a side whose host work is slow (a compiled function's guards and wrapper)
    gets smaller batches rather than samples that hold host time."""
    if enqueue_us <= 0:
        return MAX_BATCH
    return max(1, min(MAX_BATCH, int((MAX_SPIN_US - 20.0) / (1.25 * enqueue_us))))


def round_order(sides, round_index):
    """The sides' order in a round: as given on even rounds, reversed on odd ones, so
    that no side always runs right after the same other one."""
    return list(sides) if round_index % 2 == 0 else list(reversed(sides))


class Inline:
    """Runs a call on the calling thread: eager's first pick, the main thread's."""

    def run(self, call):
        return call()


class Worker:
    """A thread that runs the calls handed to it one at a time and hands back each one's
    result or exception. Eager's further picks live on workers: PyTorch keeps its cuDNN
    plans per thread, so a convolution's first call on a worker makes cudnn.benchmark
    choose its engine afresh, and that thread's later calls run that choice."""

    def __init__(self, name):
        self._calls = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            item = self._calls.get()
            if item is None:
                return
            call, done = item
            try:
                done.put((True, call()))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                done.put((False, e))

    def run(self, call):
        done = queue.Queue(maxsize=1)
        self._calls.put((call, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def close(self):
        self._calls.put(None)
        self._thread.join()


def fastest_pick(entries):
    """Index of the pick whose timing has the least median, or None when none has one."""
    timed = [(entry["median_us"], i) for i, entry in enumerate(entries)
             if entry and entry.get("median_us") is not None]
    return min(timed)[1] if timed else None


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------

PROTOCOLS = {
    "cold": ("tilesched's bench protocol, L2 cold: each call uses the next of enough "
             "rotated buffer copies (inputs, bias, output) to touch more than 2x L2 per "
             "rotation (at most 1000, within 1/4 of free memory; PyTorch's outputs are "
             "kept alive over a rotation so that they rotate too); 3 warm-up calls, then "
             "each call timed between its own pair of CUDA events, in batches of at most "
             "256 (fewer for a side whose host work is slow) enqueued behind a GPU busy-wait "
             "(at most 20 ms) that covers their host enqueue time, so "
             "host launch overhead never lands in a sample; until the samples sum to the "
             "time budget and count; sides interleaved over rounds (ours, eager, compile; "
             "reversed on odd rounds); median over all samples. Our output is zeroed "
             "before every call where the kernel adds into it (split-K), inside the timing."),
    "warm": ("CUDA graph of 40 back-to-back calls on one buffer set (L2 warm, no host "
             "overhead), warmed by 3 replays, then 15 replays each timed with CUDA "
             "events; per-call time = replay time / 40; median of the 15."),
}


def _number(value, digits):
    """A finite float rounded for the report, else None (JSON has no NaN)."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def summarize(rows, counts_given):
    """Top-level comparison figures of the report from its rows: geomeans of the other
    side's time over ours (>1: ours is faster) over exact rows that have both times,
    and count-weighted totals over the same rows."""
    summary = {}
    for protocol, prefix in (("cold", ""), ("warm", "warm_")):
        for other in ("eager", "compile"):
            pairs = _pairs(rows, protocol, lambda row: _side(row, protocol, other))
            g = geomean([theirs / ours for _, ours, theirs in pairs])
            summary[f"{prefix}geomean_vs_{other}"] = _number(g, 4)
            summary[f"{prefix}compared_vs_{other}"] = len(pairs)
            ours_total = sum(c * o for c, o, _ in pairs)
            theirs_total = sum(c * t for c, _, t in pairs)
            summary.setdefault("weighted_totals", {}).setdefault(protocol, {})[other] = {
                "rows": len(pairs),
                "ours_us": _number(ours_total, 3) if pairs else None,
                f"{other}_us": _number(theirs_total, 3) if pairs else None,
                "speedup": _number(theirs_total / ours_total, 4)
                if pairs and ours_total > 0 else None,
            }
        # Eager's first pick alone: what a single PyTorch process would have run.
        pairs = _pairs(rows, protocol, lambda row: _pick(row, 0, protocol))
        summary[f"{prefix}geomean_vs_eager_first_pick"] = _number(
            geomean([first / ours for _, ours, first in pairs]), 4)
    summary["compared"] = summary["compared_vs_eager"]
    summary["weighted_totals"]["counts"] = "from --counts" if counts_given else "all 1"
    return summary


def _fmt_us(value):
    return "-" if value is None else (f"{value:.1f}" if value >= 100 else f"{value:.2f}")


def _fmt_x(value):
    return "-" if value is None else f"{value:.2f}×"


def _side(row, protocol, side):
    timing = (row.get(protocol) or {}).get(side) or {}
    return timing.get("median_us")


def _pick(row, index, protocol):
    """The median of eager's pick `index` under `protocol`, if it has one."""
    picks = row.get("eager_picks") or []
    return ((picks[index] if index < len(picks) else {}).get(protocol) or {}).get("median_us")


def _pairs(rows, protocol, theirs):
    """(count, ours, theirs) medians under `protocol` of the exact rows that have both;
    `theirs(row)` is the other side's."""
    pairs = []
    for row in rows:
        ours, other = _side(row, protocol, "ours"), theirs(row)
        if row.get("exact") and ours and other:
            pairs.append((row["count"], ours, other))
    return pairs


def _types(row):
    types = row["dtype"] if row["out_dtype"] == row["dtype"] else \
        f"{row['dtype']}→{row['out_dtype']}"
    return f"{types} {row['layout']}" if row.get("op") == "conv2d" else types


def render_markdown(report):
    """peer.md from the report dict that peer.json holds."""
    lines = ["# tilesched beside PyTorch", ""]
    lines.append(f"- device: {report['device']}")
    versions = [f"torch {report['torch']}", f"CUDA {report['cuda']}",
                f"cuDNN {report['cudnn']}", f"Triton {report['triton'] or '-'}"]
    lines.append("- " + ", ".join(versions))
    lines.append(f"- date: {report['date']}")
    lines.append(f"- command: `{report['command']}`")
    settings = report.get("settings", {})
    limit = settings.get("cudnn_benchmark_limit")
    if limit is not None:
        tried = ("every cuDNN configuration" if limit == 0
                 else f"at most {limit} cuDNN configurations")
        picks = settings.get("eager_picks", 1)
        lines.append(f"- eager: `cudnn.benchmark` times {tried} per convolution "
                     f"(`torch.backends.cudnn.benchmark_limit = {limit}`)"
                     + (f", choosing afresh on each of {picks} threads; the fastest pick is "
                        "kept" if picks > 1 else ""))
    for name, words in report["protocols"].items():
        lines.append(f"- {name}: {words}")
    lines += ["", "Times in µs (median); ×eager and ×compile are the other side's time "
                  "over ours (above 1: ours is faster). Rows whose output is not exact "
                  "are left out of the geomeans.", ""]
    header = ["task", "types", "ours cold", "eager cold", "compile cold", "×eager",
              "×compile", "ours warm", "eager warm", "compile warm", "×eager warm",
              "×compile warm", "exact"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * 10 + [":---:"]) + "|")
    for row in report["rows"]:
        exact = "yes" if row.get("exact") else ("error" if row.get("error") else "**NO**")
        cells = [f"`{row['task']}`" + (f" ×{row['count']}" if row["count"] != 1 else ""),
                 _types(row)]
        for protocol, prefix in (("cold", ""), ("warm", "warm_")):
            cells += [_fmt_us(_side(row, protocol, s)) for s in ("ours", "eager", "compile")]
            cells += [_fmt_x(row.get(f"{prefix}speedup_vs_eager")),
                      _fmt_x(row.get(f"{prefix}speedup_vs_compile"))]
        cells.append(exact)
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for protocol, prefix in (("cold", ""), ("warm", "warm_")):
        parts = []
        for other in ("eager", "compile"):
            g = report.get(f"{prefix}geomean_vs_{other}")
            n = report.get(f"{prefix}compared_vs_{other}", 0)
            parts.append(f"{_fmt_x(g)} vs {other} ({n} rows)")
        lines.append(f"- geomean speedup, {protocol}: " + ", ".join(parts))
    if any(len(row.get("eager_picks") or []) > 1 for row in report["rows"]):
        lines.append("- against eager's first pick alone (one PyTorch process's choice): "
                     f"{_fmt_x(report.get('geomean_vs_eager_first_pick'))} cold, "
                     f"{_fmt_x(report.get('warm_geomean_vs_eager_first_pick'))} warm")
    totals = report.get("weighted_totals") or {}
    for protocol in ("cold", "warm"):
        for other in ("eager", "compile"):
            t = (totals.get(protocol) or {}).get(other) or {}
            if t.get("rows"):
                lines.append(
                    f"- total ({protocol}, counts {totals.get('counts')}), {t['rows']} rows: "
                    f"ours {_fmt_us(t['ours_us'])} µs, {other} {_fmt_us(t[f'{other}_us'])} µs "
                    f"({_fmt_x(t['speedup'])})")
    picked = [row for row in report["rows"] if len(row.get("eager_picks") or []) > 1]
    if picked:
        lines += ["", "## Eager's picks", "",
                  "PyTorch's cudnn.benchmark chose afresh on each thread (its cuDNN plans are "
                  "kept per thread); each protocol above keeps the fastest pick. µs, in pick "
                  "order:", ""]
        for row in picked:
            cells = []
            for protocol in ("cold", "warm"):
                times = [_fmt_us(_pick(row, i, protocol))
                         for i in range(len(row["eager_picks"]))]
                cells.append(f"{protocol} " + ", ".join(times))
            lines.append(f"- `{row['task']}`: " + "; ".join(cells))
    notes = [(row["task"], note) for row in report["rows"] for note in row.get("notes", [])]
    if notes:
        lines += ["", "## Notes", ""]
        lines += [f"- `{task}`: {note}" for task, note in notes]
    skipped = report.get("skipped") or []
    if skipped:
        lines += ["", "## Skipped", ""]
        lines += [f"- `{s['task']}` ({s['source']}): {s['reason']}" for s in skipped]
    errors = [(row["task"], what, row[field]) for row in report["rows"]
              for what, field in (("error", "error"), ("torch.compile", "compile_error"),
                                  ("eager", "eager_error"))
              if row.get(field)]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- `{task}` ({what}): {message}" for task, what, message in errors]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# CUDA driver API (ctypes)
# --------------------------------------------------------------------------------------

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13  # kHz, the peak SM clock
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4  # CUlaunchAttributeID


# cuLaunchKernelEx's arguments, laid out as cuda.h (CUDA 12 and 13) declares them.
class CUlaunchAttributeClusterDim(ctypes.Structure):
    """CUlaunchAttributeValue's clusterDim member: blocks per cluster."""
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class CUlaunchAttributeValue(ctypes.Union):
    """A union of 64 bytes (its `char pad[64]`), aligned to 8 by its pointer members
    (`_align` stands for them); clusterDim at offset 0."""
    _fields_ = [("pad", ctypes.c_char * 64), ("_align", ctypes.c_uint64),
                ("clusterDim", CUlaunchAttributeClusterDim)]


class CUlaunchAttribute(ctypes.Structure):
    """{CUlaunchAttributeID id (a C enum, 4 bytes); char pad[8 - sizeof(id)];
    CUlaunchAttributeValue value;}: 72 bytes, the value at offset 8."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", CUlaunchAttributeValue)]


class CUlaunchConfig(ctypes.Structure):
    """cuLaunchKernelEx's launch: grid, block, dynamic shared memory, stream and
    attributes (natural C alignment: 56 bytes on 64-bit hosts)."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(CUlaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def launch_config(launch, stream):
    """(CUlaunchConfig, its one CUlaunchAttribute, which the config points to and must
    outlive it) of a Launch with clusters, on `stream` (a CUstream address or None)."""
    attribute = CUlaunchAttribute()
    attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cx, cy, cz = launch.cluster
    attribute.value.clusterDim = CUlaunchAttributeClusterDim(cx, cy, cz)
    (gx, gy, gz), (bx, by, bz) = launch.grid, launch.block
    config = CUlaunchConfig(gx, gy, gz, bx, by, bz, launch.dynamic_shared_bytes, stream,
                            ctypes.pointer(attribute), 1)
    return config, attribute


class CudaError(RuntimeError):
    """A failed driver call, named by the driver (e.g. CUDA_ERROR_ILLEGAL_ADDRESS)."""


class CudaDriver:
    """The few driver calls needed to load a cubin into PyTorch's context and launch
    its kernel on PyTorch's streams."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        c_void_pp = ctypes.POINTER(ctypes.c_void_p)
        signatures = {
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuInit": [ctypes.c_uint],
            "cuCtxGetCurrent": [c_void_pp],
            "cuCtxSetCurrent": [ctypes.c_void_p],
            "cuCtxGetDevice": [ctypes.POINTER(ctypes.c_int)],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuDevicePrimaryCtxRetain": [c_void_pp, ctypes.c_int],
            "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
            "cuModuleLoadData": [c_void_pp, ctypes.c_void_p],
            "cuModuleUnload": [ctypes.c_void_p],
            "cuModuleGetFunction": [c_void_pp, ctypes.c_void_p, ctypes.c_char_p],
            "cuFuncSetAttribute": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int],
            "cuMemsetD8Async": [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t,
                                ctypes.c_void_p],
            "cuLaunchKernel": [ctypes.c_void_p] + [ctypes.c_uint] * 7
                              + [ctypes.c_void_p, c_void_pp, c_void_pp],
            # The workspace (cuda.h maps these names to their _v2 symbols).
            "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
            "cuMemFree_v2": [ctypes.c_uint64],
            "cuMemsetD8_v2": [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t],
            "cuCtxSynchronize": [],
        }
        # CUDA 12 drivers and later (cuLaunchKernelEx: 11.8); only kernels that take
        # tensor maps, or that run in thread block clusters, need them.
        optional = {
            "cuTensorMapEncodeTiled": [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                                       ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                                       ctypes.POINTER(ctypes.c_uint64),
                                       ctypes.POINTER(ctypes.c_uint32),
                                       ctypes.POINTER(ctypes.c_uint32)]
                                      + [ctypes.c_uint] * 4,
            "cuLaunchKernelEx": [ctypes.POINTER(CUlaunchConfig), ctypes.c_void_p, c_void_pp,
                                 c_void_pp],
            "cuTensorMapEncodeIm2col": [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                                        ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                                        ctypes.POINTER(ctypes.c_uint64),
                                        ctypes.POINTER(ctypes.c_int),
                                        ctypes.POINTER(ctypes.c_int),
                                        ctypes.c_uint32, ctypes.c_uint32,
                                        ctypes.POINTER(ctypes.c_uint32)]
                                       + [ctypes.c_uint] * 4,
        }
        self.has_tensor_maps = hasattr(lib, "cuTensorMapEncodeTiled")
        self.has_launch_ex = hasattr(lib, "cuLaunchKernelEx")
        for name, argtypes in list(signatures.items()) + list(optional.items()):
            if name in optional and not hasattr(lib, name):
                continue
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        self.lib = lib

    def check(self, result, what):
        if result != 0:
            name = ctypes.c_char_p()
            if self.lib.cuGetErrorName(result, ctypes.byref(name)) == 0 and name.value:
                raise CudaError(f"{what}: {name.value.decode()}")
            raise CudaError(f"{what}: CUresult {result}")

    def use_primary_context(self, ordinal):
        """Makes device `ordinal`'s primary context (the one PyTorch allocates in)
        current on this thread, if PyTorch has not already."""
        self.check(self.lib.cuInit(0), "cuInit")
        device = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        primary = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(primary), device),
                   "cuDevicePrimaryCtxRetain")
        current = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value != primary.value:
            self.check(self.lib.cuCtxSetCurrent(primary), "cuCtxSetCurrent")
        self.device = device.value

    def encode_tensor_map(self, at, tensor, address):
        """Encodes the tensor map of TensorBox `tensor` at device address `address` into
        the 128 bytes at host address `at` (64-byte aligned)."""
        if not self.has_tensor_maps:
            raise CudaError("cuTensorMapEncodeTiled: this driver predates tensor maps "
                            "(CUDA 12)")
        u64, u32, i32 = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int
        if tensor.get("im2col") is not None:
            (dtype, rank, address, dims, strides, lower, upper, channels, pixels,
             element_strides, interleave, swizzle, l2_promotion,
             oob_fill) = tensor_map_im2col_encode_args(tensor, address)
            spatial = rank - 2
            self.check(self.lib.cuTensorMapEncodeIm2col(
                at, dtype, rank, address, (u64 * rank)(*dims), (u64 * (rank - 1))(*strides),
                (i32 * spatial)(*lower), (i32 * spatial)(*upper), channels, pixels,
                (u32 * rank)(*element_strides), interleave, swizzle, l2_promotion, oob_fill),
                f"cuTensorMapEncodeIm2col({tensor['dtype']}, dims {list(tensor['dims'])}, "
                f"strides {list(tensor['strides'])}, box {list(tensor['boxed'])}, "
                f"{tensor['im2col']})")
            return
        (dtype, rank, address, dims, strides, boxed, element_strides, interleave, swizzle,
         l2_promotion, oob_fill) = tensor_map_encode_args(tensor, address)
        self.check(self.lib.cuTensorMapEncodeTiled(
            at, dtype, rank, address, (u64 * rank)(*dims), (u64 * max(1, rank - 1))(*strides),
            (u32 * rank)(*boxed), (u32 * rank)(*element_strides), interleave, swizzle,
            l2_promotion, oob_fill),
            f"cuTensorMapEncodeTiled({tensor['dtype']}, dims {list(tensor['dims'])}, "
            f"strides {list(tensor['strides'])}, box {list(tensor['boxed'])}, "
            f"swizzle {tensor['swizzle']})")

    def attribute(self, attribute):
        value = ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, self.device),
                   f"cuDeviceGetAttribute({attribute})")
        return value.value


class LoadedKernel:
    """One cubin's kernel in the current context, launched with the tilesched calling
    convention (runtime::Kernel::launch, gpu::buffers::BufferSets::launch,
    gpu::cuda::Context::launch_mapped): one device pointer per buffer (input, weight,
    bias if any, output); then, where the launch has `workspace_bytes`, one pointer to
    that much scratch, allocated and zeroed once here (every launch leaves it zeroed;
    launches are sequential on one stream, so they share it); then, per entry of the
    launch's `tensor_maps`, a 128-byte CUtensorMap by value, encoded in `bind` for that
    buffer set's buffer. The output is zeroed on the same stream first where the kernel
    adds into it (`zero_output`). A kernel without clusters is launched with
    cuLaunchKernel; one in thread block clusters with cuLaunchKernelEx, the cluster
    dimension its one launch attribute (gpu::cuda::launch_raw)."""

    def __init__(self, driver, candidate):
        self.driver = driver
        self.launch = candidate.launch
        self.workspace = 0  # device address of the scratch, 0 when none
        self.configs = {}  # stream: launch_config(...) of a kernel with clusters
        self.image = ctypes.create_string_buffer(candidate.image, len(candidate.image))
        self.module = ctypes.c_void_p()
        driver.check(driver.lib.cuModuleLoadData(ctypes.byref(self.module), self.image),
                     f"cuModuleLoadData({candidate.image_path})")
        self.function = ctypes.c_void_p()
        try:
            driver.check(driver.lib.cuModuleGetFunction(
                ctypes.byref(self.function), self.module, candidate.kernel.encode()),
                f"cuModuleGetFunction({candidate.kernel})")
            # Opting in above 48 KiB is required; setting it below is harmless.
            driver.check(driver.lib.cuFuncSetAttribute(
                self.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                self.launch.dynamic_shared_bytes),
                "cuFuncSetAttribute(max dynamic shared memory)")
            if self.launch.tensor_maps and not driver.has_tensor_maps:
                raise CudaError("cuTensorMapEncodeTiled: this driver predates tensor maps "
                                "(CUDA 12), which the kernel takes")
            if self.launch.cluster != (1, 1, 1) and not driver.has_launch_ex:
                raise CudaError(f"cuLaunchKernelEx: this driver predates it (CUDA 11.8), and "
                                f"the kernel runs in clusters of {list(self.launch.cluster)}")
            if self.launch.workspace_bytes:
                lib, size = driver.lib, self.launch.workspace_bytes
                workspace = ctypes.c_uint64()
                driver.check(lib.cuMemAlloc_v2(ctypes.byref(workspace), size),
                             f"cuMemAlloc({size} B workspace)")
                self.workspace = workspace.value
                driver.check(lib.cuMemsetD8_v2(self.workspace, 0, size),
                             "cuMemsetD8(workspace)")
                # Zeroed before any stream (blocking or not) launches the kernel.
                driver.check(lib.cuCtxSynchronize(), "cuCtxSynchronize")
        except CudaError:
            self.unload()
            raise

    def bind(self, pointers, output_bytes):
        """The launch arguments of one buffer set (`pointers`: its buffers' device
        addresses in parameter order), built once (the driver copies the values at each
        launch, so they are reused): the buffers' pointers, the workspace's, then the
        tensor maps encoded for this set's buffers. Returns (the ctypes objects the
        parameters point into, kept alive with it; the parameter array; the output's
        address, the last buffer's; the output's bytes)."""
        words = list(pointers) + ([self.workspace] if self.workspace else [])
        values = (ctypes.c_uint64 * len(words))(*words)
        size = ctypes.sizeof(ctypes.c_uint64)
        addresses = [ctypes.addressof(values) + i * size for i in range(len(words))]
        maps = None
        if self.launch.tensor_maps:
            count = len(self.launch.tensor_maps)
            maps = ctypes.create_string_buffer(count * TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN)
            first = ctypes.addressof(maps)
            first += -first % TENSOR_MAP_ALIGN
            for i, arg in enumerate(self.launch.tensor_maps):
                if arg.buffer >= len(pointers):
                    raise CudaError(f"tensor map {i} describes buffer {arg.buffer} of "
                                    f"{len(pointers)}")
                at = first + i * TENSOR_MAP_BYTES
                self.driver.encode_tensor_map(at, arg.tensor, pointers[arg.buffer])
                addresses.append(at)
        params = (ctypes.c_void_p * len(addresses))(*addresses)
        return (values, maps), params, pointers[-1], output_bytes

    def __call__(self, bound, stream):
        _, params, output, output_bytes = bound
        lib, check = self.driver.lib, self.driver.check
        if self.launch.zero_output:
            check(lib.cuMemsetD8Async(output, 0, output_bytes, stream), "cuMemsetD8Async")
        if self.launch.cluster != (1, 1, 1):
            # One config per stream, built once: the driver only reads it.
            config = self.configs.get(stream)
            if config is None:
                config = self.configs[stream] = launch_config(self.launch, stream)
            check(lib.cuLaunchKernelEx(ctypes.byref(config[0]), self.function, params, None),
                  f"cuLaunchKernelEx(cluster {list(self.launch.cluster)})")
            return
        (gx, gy, gz), (bx, by, bz) = self.launch.grid, self.launch.block
        check(lib.cuLaunchKernel(self.function, gx, gy, gz, bx, by, bz,
                                 self.launch.dynamic_shared_bytes, stream, params, None),
              "cuLaunchKernel")

    def unload(self):
        """Frees the workspace and unloads the module (once the stream is idle)."""
        try:
            if self.workspace:
                workspace, self.workspace = self.workspace, 0
                self.driver.check(self.driver.lib.cuMemFree_v2(workspace), "cuMemFree")
        finally:
            if self.module:
                module, self.module = self.module, ctypes.c_void_p()
                self.driver.check(self.driver.lib.cuModuleUnload(module), "cuModuleUnload")


# --------------------------------------------------------------------------------------
# GPU side (torch imported lazily)
# --------------------------------------------------------------------------------------


class CompileTimeout(BaseException):
    """torch.compile ran past --compile-timeout. A BaseException, like
    KeyboardInterrupt, because inductor catches Exception around autotuning choices and
    would swallow it."""


def _one_line(error, limit=400):
    text = f"{type(error).__name__}: {error}".strip()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def torch_dtype(torch, name):
    return {"f32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
            "bf16": torch.bfloat16}[name]


def set_tf32(torch, enabled):
    """TF32 math for cuDNN and cuBLAS on or off (off for f32 tasks: full f32 math).

    Through the legacy flags on purpose: in torch >= 2.9 their setters update both the
    legacy and the new (`fp32_precision`) state (ATen Context::setAllowTF32CuBLAS,
    setAllowTF32CuDNN), whereas setting only the new API leaves the legacy matmul
    precision at "highest", and inductor's max-autotune, which reads it, then fails
    with "mix of the legacy and new APIs" on TF32 tasks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy flags' deprecation notice
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def mm_out_dtype(torch):
    """Whether this torch's mm/bmm take out_dtype (half inputs, float32 output)."""
    try:
        a = torch.ones((16, 16), device="cuda", dtype=torch.float16)
        torch.mm(a, a, out_dtype=torch.float32)
        torch.bmm(a[None], a[None], out_dtype=torch.float32)
        return True
    except (TypeError, RuntimeError):
        return False


def torch_function(torch, task):
    """PyTorch's computation of the task, fn(input, weight, bias) -> output, and notes
    on how it differs from our kernel's (explicit padding, an output conversion)."""
    F = torch.nn.functional
    notes = []
    convert = torch_dtype(torch, task.dtype) != torch_dtype(torch, task.out_dtype)
    if convert:
        notes.append(f"PyTorch computes in {task.dtype} and converts the result to "
                     f"{task.out_dtype} (conversion timed)")
    if task.op == "conv2d":
        stride = (task.stride_h, task.stride_w)
        dilation = (task.dilation_h, task.dilation_w)
        groups = task.groups
        if asymmetric_padding(task):
            bottom, right = pad_end(task)
            pads = (task.pad_w, right, task.pad_h, bottom)  # F.pad: last dim first
            notes.append("asymmetric padding applied with F.pad before the convolution "
                         "(PyTorch side only; timed)")

            def contract(x, w, bias):
                return F.conv2d(F.pad(x, pads), w, bias, stride=stride, padding=0,
                                dilation=dilation, groups=groups)
        else:
            padding = (task.pad_h, task.pad_w)

            def contract(x, w, bias):
                return F.conv2d(x, w, bias, stride=stride, padding=padding,
                                dilation=dilation, groups=groups)
    elif convert and mm_out_dtype(torch):
        # A half matmul with a float32 output in one cuBLAS call (torch.mm/bmm's
        # out_dtype), as our kernel writes it: no half rounding, no conversion kernel.
        convert = False
        notes[-1] = f"PyTorch's mm/bmm with out_dtype={task.out_dtype}"
        out = torch_dtype(torch, task.out_dtype)
        mm = torch.mm if task.op == "matmul" else torch.bmm

        def contract(a, b, bias):
            # The exact reference calls this in float64, where out_dtype is refused.
            if a.dtype in (torch.float16, torch.bfloat16):
                y = mm(a, b, out_dtype=out)
            else:
                y = mm(a, b)
            return y if bias is None else y + bias
    elif task.op == "matmul":
        def contract(a, b, bias):
            # addmm reaches cuBLASLt's bias epilogue.
            return a @ b if bias is None else torch.addmm(bias, a, b)
    else:
        def contract(a, b, bias):
            y = torch.bmm(a, b)
            return y if bias is None else y + bias

    relu = task.relu

    def fn(x, w, bias):
        y = contract(x, w, bias)
        if relu:
            y = torch.relu(y)
        if convert:
            y = y.float()
        return y

    return fn, notes, contract


class BufferSet:
    """One set of a task's tensors, in kernel parameter order."""

    def __init__(self, tensors):
        self.tensors = tensors  # input, weight, [bias], output

    @property
    def args(self):
        """The PyTorch function's arguments: input, weight, bias (or None)."""
        t = self.tensors
        return (t[0], t[1], t[2] if len(t) == 4 else None)

    @property
    def output(self):
        return self.tensors[-1]


def _check_storage(tensor, spec):
    """Our kernels index the tensor's storage as `spec.storage_shape`, row-major: it
    must be exactly that, dense and from offset 0."""
    view = tensor.permute(0, 2, 3, 1) if spec.channels_last else tensor
    assert tuple(view.shape) == spec.storage_shape and view.is_contiguous(), spec


def make_first_set(torch, task, specs, plan, generator):
    """Buffer set 0, filled by the value plan."""
    device = "cuda"
    m = plan.magnitude
    tensors = []
    for spec in specs:
        dtype = torch_dtype(torch, spec.dtype)
        fmt = torch.channels_last if spec.channels_last else torch.contiguous_format
        if spec.role == "output":
            t = torch.empty(spec.logical_shape, dtype=dtype, device=device, memory_format=fmt)
        elif spec.role == "weight" and plan.weight_nonzeros is not None:
            t = sparse_weight(torch, task, spec, plan.weight_nonzeros, generator).to(dtype)
            t = t.contiguous(memory_format=fmt)
        else:
            t = torch.randint(-m, m + 1, spec.logical_shape, generator=generator,
                              device=device, dtype=torch.int32).to(dtype)
            t = t.contiguous(memory_format=fmt)
        _check_storage(t, spec)
        tensors.append(t)
    return BufferSet(tensors)


def sparse_weight(torch, task, spec, nonzeros, generator):
    """Weights of ±1 with exactly `nonzeros` non-zeros per output's reduction row, at
    random places, in the logical shape (float32)."""
    # One row per output feature: conv2d's K filters; B's columns (per batch) otherwise.
    if task.op == "conv2d":
        rows = task.k
    elif task.op == "matmul":
        rows = task.n
    else:
        rows = task.b * task.n
    reduction = reduction_length(task)
    out = torch.zeros(rows, reduction, device="cuda", dtype=torch.float32)
    chunk = max(1, (1 << 24) // reduction)  # bounds the argsort's memory
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        keys = torch.rand(stop - start, reduction, generator=generator, device="cuda")
        places = keys.argsort(dim=1)[:, :nonzeros]
        signs = torch.randint(0, 2, places.shape, generator=generator,
                              device="cuda").float() * 2 - 1
        out[start:stop].scatter_(1, places, signs)
    if task.op == "conv2d":
        return out.view(spec.logical_shape)
    if task.op == "matmul":
        return out.t().contiguous()  # rows were B's columns
    b, k, n = spec.logical_shape
    return out.view(b, n, k).transpose(1, 2).contiguous()


def copy_set(torch, first):
    """Another set with set 0's inputs (same strides); its output uninitialized."""
    tensors = [torch.empty_like(t).copy_(t) for t in first.tensors[:-1]]
    tensors.append(torch.empty_like(first.output))
    return BufferSet(tensors)


def reference(torch, contract, relu, s):
    """The exact result in float64: the same computation on upcast inputs, rounded to
    integers (every true value is one; rounding removes any algorithm's float64
    rounding, e.g. an FFT convolution's)."""
    x, w, bias = s.args
    y = contract(x.double(), w.double(), None if bias is None else bias.double())
    if relu:
        y = torch.relu(y)
    return torch.round(y)


def compare(torch, got, ref):
    """(elements that differ, max abs difference or None if any is not finite,
    non-finite elements) of `got` against the float64 reference."""
    diff = got.double() - ref
    finite = torch.isfinite(diff)
    nonfinite = int((~finite).sum().item())
    mismatches = int((diff != 0).logical_or(~finite).sum().item())
    max_error = None if nonfinite else float(diff.abs().max().item()) if diff.numel() else 0.0
    return mismatches, max_error, nonfinite


class Timer:
    """Both protocols, with events allocated once."""

    def __init__(self, torch, sm_clock_khz):
        self.torch = torch
        self.cycles_per_us = sm_clock_khz / 1000.0
        self.starts = [torch.cuda.Event(enable_timing=True) for _ in range(MAX_BATCH)]
        self.ends = [torch.cuda.Event(enable_timing=True) for _ in range(MAX_BATCH)]

    def spin(self, us):
        self.torch.cuda._sleep(int(us * self.cycles_per_us))

    def cold(self, call, first_call, min_time_us, min_repeats, max_repeats):
        """Samples (µs) of calls `first_call`, `first_call + 1`, ... by the cold protocol;
        returns (samples, the next call's index)."""
        torch = self.torch
        i = first_call
        issued = time.perf_counter()
        for _ in range(WARMUP_CALLS):
            call(i)
            i += 1
        # The first estimate of the host's enqueue time per call, generous: warm-up
        # calls are the slowest. Each batch then measures its own for the next.
        enqueue_us = max(50.0, (time.perf_counter() - issued) * 1e6 / WARMUP_CALLS)
        torch.cuda.synchronize()
        samples = []
        while not enough(samples, min_time_us, min_repeats, max_repeats):
            batch = min(next_batch(samples, min_time_us, min_repeats, max_repeats),
                        batch_cap_for_spin(enqueue_us))
            gc.disable()  # a collection pause inside the enqueue would outlast the spin
            try:
                self.spin(spin_us(batch, enqueue_us))
                issued = time.perf_counter()
                for j in range(batch):
                    self.starts[j].record()
                    call(i)
                    i += 1
                    self.ends[j].record()
                enqueue_us = (time.perf_counter() - issued) * 1e6 / batch
            finally:
                gc.enable()
            self.ends[batch - 1].synchronize()
            samples += [self.starts[j].elapsed_time(self.ends[j]) * 1e3 for j in range(batch)]
        return samples, i

    def warm(self, call):
        """Median per-call µs of GRAPH_CALLS calls captured in one CUDA graph."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
            for _ in range(WARMUP_CALLS):
                call()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                call()
        try:
            for _ in range(GRAPH_WARMUP_REPLAYS):
                graph.replay()
            torch.cuda.synchronize()
            issued = time.perf_counter()
            graph.replay()
            replay_host_us = (time.perf_counter() - issued) * 1e6
            torch.cuda.synchronize()
            self.spin(spin_us(GRAPH_TIMED_REPLAYS, replay_host_us))
            for j in range(GRAPH_TIMED_REPLAYS):
                self.starts[j].record()
                graph.replay()
                self.ends[j].record()
            torch.cuda.synchronize()
            per_call = [self.starts[j].elapsed_time(self.ends[j]) * 1e3 / GRAPH_CALLS
                        for j in range(GRAPH_TIMED_REPLAYS)]
        finally:
            del graph
        return median(per_call)


class wall_limit:
    """Raises CompileTimeout in the main thread after `seconds` of wall time, and again
    every second after that until the block is left (in case a handler still eats it)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def _expired(self, signum, frame):
        raise CompileTimeout(f"torch.compile took over {self.seconds:g} s (--compile-timeout)")

    def __enter__(self):
        self.previous = signal.signal(signal.SIGALRM, self._expired)
        signal.setitimer(signal.ITIMER_REAL, self.seconds, 1.0)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)
        return False


def timing_entry(samples):
    """A side's cold timing in the report."""
    return {"median_us": _number(median(samples), 3),
            "p10_us": _number(percentile(samples, 10), 3),
            "p90_us": _number(percentile(samples, 90), 3),
            "samples": len(samples)}


def eager_pick_names(picks):
    """The cold and warm sides of eager's picks: "eager" for the first, then "eager pick 2",
    "eager pick 3", ..."""
    return ["eager"] + [f"eager pick {p}" for p in range(2, picks + 1)]


def run_task(torch, driver, timer, candidate, args, count, l2_bytes, pickers):
    """Checks and times one candidate; returns its report row. `pickers` run eager's
    picks (Inline first, then Workers); a convolution takes up to --eager-picks of them,
    any other task one (cuBLAS's choice does not vary between threads)."""
    task = candidate.task
    specs = buffer_specs(task)
    plan = value_plan(reduction_length(task), task.dtype, task.out_dtype, task.bias)
    row = {
        "task": candidate.key, "source": candidate.source, "kernel": candidate.kernel,
        "count": count, "op": task.op, "dtype": task.dtype, "out_dtype": task.out_dtype,
        "layout": task.layout, "epilogue": {"bias": task.bias, "relu": task.relu},
        "flops": flops(task),
        "launch": {"grid": list(candidate.launch.grid), "block": list(candidate.launch.block),
                   "dynamic_shared_bytes": candidate.launch.dynamic_shared_bytes,
                   "zero_output": candidate.launch.zero_output,
                   "workspace_bytes": candidate.launch.workspace_bytes,
                   "tensor_maps": len(candidate.launch.tensor_maps),
                   "cluster": list(candidate.launch.cluster)},
        "tuned_us": candidate.tuned_us,
        "values": {"magnitude": plan.magnitude, "weight_nonzeros_per_output":
                   plan.weight_nonzeros, "worst_case_abs_sum": plan.worst_case,
                   "exact_below": plan.limit},
        "copies": None, "set_bytes": set_bytes(task),
        "exact": False, "mismatches": None, "ours_max_abs_error": None,
        "eager_max_abs_error": None, "compile_max_abs_error": None,
        "cold": {"ours": None, "eager": None, "compile": None},
        "warm": {"ours": None, "eager": None, "compile": None},
        "speedup_vs_eager": None, "speedup_vs_compile": None,
        "warm_speedup_vs_eager": None, "warm_speedup_vs_compile": None,
        "eager_picks": [],
        "compile_seconds": None, "compile_error": None, "eager_error": None, "error": None,
        "notes": list(candidate.notes),
    }
    set_tf32(torch, task.dtype == "tf32")
    fn, notes, contract = torch_function(torch, task)
    row["notes"] += notes
    if plan.weight_nonzeros is not None:
        narrowest = min((task.dtype, task.out_dtype), key=EXACT_LIMIT.get)
        row["notes"].append(f"weights hold {plan.weight_nonzeros} non-zeros (±1) per output "
                            f"out of {reduction_length(task)}, so that every sum is exact in "
                            f"{narrowest}")
    kernel = None
    sets = []
    held = []
    try:
        generator = torch.Generator(device="cuda")
        generator.manual_seed(args.seed)
        sets.append(make_first_set(torch, task, specs, plan, generator))
        first = sets[0]
        expected = reference(torch, contract, task.relu, first)

        # Ours: output poisoned first, so an element the kernel never writes cannot pass
        # (a zero_output kernel's launch zeroes it, as every launch does).
        kernel = LoadedKernel(driver, candidate)
        output_bytes = specs[-1].bytes
        bound = [kernel.bind([t.data_ptr() for t in first.tensors], output_bytes)]
        first.output.fill_(float("nan"))
        kernel(bound[0], torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        mismatches, max_error, nonfinite = compare(torch, first.output, expected)
        row.update(exact=mismatches == 0, mismatches=mismatches, ours_max_abs_error=max_error)
        if nonfinite:
            row["notes"].append(f"our output has {nonfinite} non-finite elements")

        # Eager, once per pick, each on its own thread: the first call makes PyTorch's
        # cudnn.benchmark choose the engine that thread then runs.
        sides, runners = {}, {}

        def first_eager_call():
            got = fn(*first.args)
            torch.cuda.synchronize()
            return compare(torch, got, expected)

        picks = pickers[:args.eager_picks] if task.op == "conv2d" else pickers[:1]
        errors = []
        for name, runner in zip(eager_pick_names(len(picks)), picks):
            try:
                _, max_error, nonfinite = runner.run(first_eager_call)
            except Exception as e:  # noqa: BLE001 - recorded, the row goes on
                if name == "eager":
                    row["eager_error"] = _one_line(e)
                    break
                row["notes"].append(f"{name} failed: {_one_line(e)}")
                continue
            if nonfinite:
                row["notes"].append(f"{name}: output has {nonfinite} non-finite elements")
            else:
                errors.append(max_error)
            sides[name], runners[name] = fn, runner
        row["eager_max_abs_error"] = max(errors) if errors else None

        if not args.no_compile:
            torch._dynamo.reset()  # a fresh cache per task: no recompile limit reached
            compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
            started = time.monotonic()
            try:
                with wall_limit(args.compile_timeout):
                    for _ in range(WARMUP_CALLS):  # the first call compiles
                        got = compiled(*first.args)
                    torch.cuda.synchronize()
                row["compile_seconds"] = round(time.monotonic() - started, 1)
                _, row["compile_max_abs_error"], _ = compare(torch, got, expected)
                del got
                sides["compile"] = compiled
            except (Exception, CompileTimeout) as e:  # noqa: BLE001 - recorded, the row goes on
                row["compile_error"] = _one_line(e)
                torch._dynamo.reset()
        del expected
        torch.cuda.synchronize()

        # Cold: rotated copies of the buffer set.
        torch.cuda.empty_cache()  # memory PyTorch caches counts as free for the budget
        free, _ = torch.cuda.mem_get_info()
        copies = copies_per_rotation(set_bytes(task), l2_bytes, free)
        for _ in range(1, copies):
            sets.append(copy_set(torch, first))
        bound += [kernel.bind([t.data_ptr() for t in s.tensors], output_bytes) for s in sets[1:]]
        torch.cuda.synchronize()
        row["copies"] = copies
        held[:] = [None] * copies

        def ours_call(i):
            kernel(bound[i % copies], torch.cuda.current_stream().cuda_stream)

        def torch_call(side_fn):
            def call(i):
                # Kept alive over a rotation so that PyTorch's outputs rotate like ours.
                held[i % copies] = side_fn(*sets[i % copies].args)
            return call

        calls = {"ours": ours_call}
        calls.update({name: torch_call(f) for name, f in sides.items()})
        order = ["ours"] + [name for name in sides if name != "compile"]
        order += ["compile"] if "compile" in sides else []
        inline = pickers[0]  # ours and torch.compile run on the main thread

        def failed(name, error):
            if name in ("eager", "compile"):
                row[f"{name}_error"] = _one_line(error)
            else:
                row["notes"].append(f"{name} failed: {_one_line(error)}")

        samples = {name: [] for name in order}
        next_call = {name: 0 for name in order}
        rounds = args.rounds
        per_round = (args.min_time_ms * 1e3 / rounds, math.ceil(args.min_repeats / rounds),
                     max(1, args.max_repeats // rounds))
        for r in range(rounds):
            for name in round_order(order, r):
                if name not in calls:
                    continue
                call, first_call = calls[name], next_call[name]
                try:
                    got, next_call[name] = runners.get(name, inline).run(
                        lambda: timer.cold(call, first_call, *per_round))
                    samples[name] += got
                except Exception as e:  # noqa: BLE001
                    if name == "ours":
                        raise
                    failed(name, e)
                    del calls[name]
                    samples[name] = []
                finally:
                    held[:] = [None] * copies
        cold = {name: timing_entry(samples[name]) if samples[name] else None for name in order}
        del sets[1:], bound[1:]

        # Warm: CUDA graphs on set 0.
        def warm_call(side_fn):
            return lambda: side_fn(*first.args)

        warm_calls = {"ours": lambda: kernel(bound[0], torch.cuda.current_stream().cuda_stream)}
        warm_calls.update({name: warm_call(sides[name]) for name in order[1:]
                           if name in calls})  # not a side that failed its cold timing
        warm = {name: None for name in order}
        for name, call in warm_calls.items():
            try:
                warm[name] = {"median_us": _number(
                    runners.get(name, inline).run(lambda: timer.warm(call)), 3),
                    "calls_per_replay": GRAPH_CALLS, "replays": GRAPH_TIMED_REPLAYS}
            except Exception as e:  # noqa: BLE001
                if name == "ours":
                    raise
                row["notes"].append(f"{name} could not be timed in a CUDA graph: "
                                    f"{_one_line(e)}")
        # Each protocol keeps eager's fastest pick, as bench keeps the vendor's fastest
        # candidate; every pick's times stay in the row.
        pick_names = [name for name in order if name.startswith("eager")]
        row["eager_picks"] = [{"cold": cold[name], "warm": warm[name]} for name in pick_names]
        for protocol, entries in (("cold", cold), ("warm", warm)):
            for name in ("ours", "compile"):
                row[protocol][name] = entries.get(name)
            best = fastest_pick([entries[name] for name in pick_names])
            row[protocol]["eager"] = None if best is None else entries[pick_names[best]]
    except Exception as e:  # noqa: BLE001 - the row records it; main decides to go on
        row["error"] = _one_line(e)
        row["exact"] = False if row["mismatches"] is None else row["exact"]
    finally:
        held.clear()
        sets.clear()
        try:
            torch.cuda.synchronize()
            if kernel is not None:
                kernel.unload()
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - e.g. the context died with the kernel
            row["error"] = row["error"] or _one_line(e)
    for protocol, prefix in (("cold", ""), ("warm", "warm_")):
        ours = (row[protocol]["ours"] or {}).get("median_us")
        for other in ("eager", "compile"):
            theirs = (row[protocol][other] or {}).get("median_us")
            if ours and theirs:
                row[f"{prefix}speedup_vs_{other}"] = round(theirs / ours, 4)
    return row


def context_alive(torch):
    """False once a kernel fault has poisoned the CUDA context (nothing more can run)."""
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:  # noqa: BLE001
        return False


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message):
        fail(f"error: {message} (see --help)")


def fail(message):
    print(f"{PROG}: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative integer")
    return value


def positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def parse_args(argv):
    p = OneLineParser(prog="torch_peer.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--deploy", action="append", default=[], metavar="DIR",
                   help="deploy cache directory (its index.json); repeatable")
    p.add_argument("--export", nargs="+", action="extend", default=[], metavar="FILE.json",
                   help="sidecars of `tilesched export --format cubin --out PATH` (PATH.json)")
    p.add_argument("--counts", metavar="FILE.json",
                   help='{"task key": count} to weight the totals (default 1 each)')
    p.add_argument("--out", required=True, metavar="DIR", help="where peer.json and peer.md go")
    p.add_argument("--tasks", metavar="SUBSTR", help="only tasks whose key contains SUBSTR")
    p.add_argument("--limit", type=positive_int, metavar="N", help="at most N tasks")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--compile-timeout", type=positive_float, default=300.0, metavar="S",
                   help="wall-clock limit of one task's compilation (default 300)")
    p.add_argument("--min-time-ms", type=positive_float, default=100.0,
                   help="cold protocol: timed calls per side sum to at least this (default 100)")
    p.add_argument("--min-repeats", type=positive_int, default=40,
                   help="cold protocol: at least this many timed calls per side (default 40)")
    p.add_argument("--max-repeats", type=positive_int, default=10_000,
                   help="cold protocol: at most this many timed calls per side (default 10000)")
    p.add_argument("--rounds", type=positive_int, default=4,
                   help="cold protocol: interleaved rounds of the sides (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the input values")
    p.add_argument("--eager-picks", type=positive_int, default=4, metavar="N",
                   help="eager convolutions: PyTorch's cudnn.benchmark chooses afresh on N "
                        "threads, and each protocol keeps the fastest pick (default 4; 1: "
                        "one pick, what one PyTorch process runs)")
    p.add_argument("--cudnn-benchmark-limit", type=non_negative_int, default=0, metavar="N",
                   help="cuDNN configurations eager's cudnn.benchmark times per convolution "
                        "(torch.backends.cudnn.benchmark_limit; default 0: every one, "
                        "PyTorch's strongest eager; PyTorch's own default is 10)")
    args = p.parse_args(argv)
    if not args.deploy and not args.export:
        p.error("give --deploy DIR and/or --export FILE.json")
    if args.max_repeats < args.min_repeats:
        p.error("--max-repeats is below --min-repeats")
    return args


def import_torch():
    """torch, or exit 2 with one line saying why not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch  # noqa: PLC0415 - lazily: the pure parts run without it
    except Exception as e:  # noqa: BLE001 - any failure to import is the same answer
        fail(f"cannot import torch ({_one_line(e, 200)}); run this with the Python "
             "that has PyTorch")
    return torch


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        counts = load_counts(args.counts)
        candidates, skipped = [], []
        for directory in args.deploy:
            found, passed = load_deploy(directory)
            candidates += found
            skipped += passed
        for sidecar in args.export:
            found, passed = load_export(sidecar)
            candidates += [found] if found else []
            skipped += passed
    except InputError as e:
        fail(e)

    torch = import_torch()
    try:
        cuda_ok = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        cuda_ok = False
    if not cuda_ok:
        fail(f"torch {torch.__version__} sees no CUDA device (built for CUDA "
             f"{torch.version.cuda}); this needs a GPU")
    try:
        torch.cuda.init()
        ordinal = torch.cuda.current_device()
        torch.zeros(1, device="cuda")  # PyTorch's context exists and is current
        driver = CudaDriver()
        driver.use_primary_context(ordinal)
        sm_clock_khz = driver.attribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
    except (OSError, CudaError, RuntimeError) as e:
        fail(f"cannot use the CUDA driver: {_one_line(e, 300)}")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        fail(f"cannot create {args.out}: {e.strerror or e}")

    gpu = torch.cuda.get_device_name(ordinal)
    capability = torch.cuda.get_device_capability(ordinal)
    l2_bytes = torch.cuda.get_device_properties(ordinal).L2_cache_size
    candidates, foreign = select_for_device(candidates, gpu, capability)
    chosen, duplicates = choose_tasks(candidates, args.tasks, args.limit)
    skipped += foreign + duplicates
    torch.backends.cudnn.benchmark = True
    # PyTorch times only its first 10 cuDNN configurations unless told otherwise; a peer
    # that stands for what a performance engineer can get from eager lets it time them all.
    torch.backends.cudnn.benchmark_limit = args.cudnn_benchmark_limit

    try:
        import triton  # noqa: PLC0415
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    report = {
        "device": gpu, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
        "cuda": torch.version.cuda, "triton": triton_version,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.argv[0]) or "torch_peer.py"] + argv),
        "protocols": dict(PROTOCOLS),
        "settings": {"min_time_ms": args.min_time_ms, "min_repeats": args.min_repeats,
                     "max_repeats": args.max_repeats, "rounds": args.rounds,
                     "compile": not args.no_compile, "compile_timeout_s": args.compile_timeout,
                     "seed": args.seed, "sm_clock_mhz": sm_clock_khz // 1000,
                     "cudnn_benchmark_limit": args.cudnn_benchmark_limit,
                     "eager_picks": args.eager_picks, "l2_bytes": l2_bytes},
        "rows": [], "skipped": skipped,
    }
    timer = Timer(torch, sm_clock_khz)
    workers = [Worker(name) for name in eager_pick_names(args.eager_picks)[1:]]
    try:
        for n, candidate in enumerate(chosen, 1):
            print(f"[{n}/{len(chosen)}] {candidate.key}", file=sys.stderr, flush=True)
            row = run_task(torch, driver, timer, candidate, args,
                           counts.get(candidate.key, 1), l2_bytes, [Inline()] + workers)
            report["rows"].append(row)
            if row["error"] and not context_alive(torch):
                for rest in chosen[n:]:
                    skipped.append({"task": rest.key, "source": rest.source, "reason":
                                    f"not run: the CUDA context failed on {candidate.key}"})
                break
    finally:
        for worker in workers:
            worker.close()
    report.update(summarize(report["rows"], args.counts is not None))
    # Top-level keys in the documented order, rows and skipped last.
    ordered = {k: report[k] for k in report if k not in ("rows", "skipped")}
    ordered.update(rows=report["rows"], skipped=report["skipped"])
    markdown = render_markdown(ordered)
    with open(os.path.join(args.out, "peer.json"), "w", encoding="utf-8") as f:
        json.dump(ordered, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "peer.md"), "w", encoding="utf-8") as f:
        f.write(markdown)
    print(markdown, end="")
    wrong = [row["task"] for row in report["rows"] if not row["exact"] or row["error"]]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
