"""Tasks and their keys, as tilesched's Rust side names them (schedule/src/task.rs).

A deploy cache is looked up by task key (`conv2d_n1_c64_h56_w56_k64_r3_s3_st1_p1_bias_relu_fp16_out_fp16_nhwc`),
so the key a PyTorch layer derives must be the one `tune` and `deploy` wrote, character
for character. This module derives keys from shapes, parses them back (the operators'
fake implementations read their output shape from the key), and writes the task lists
that `tilesched tune --tasks FILE` reads. It imports nothing outside the standard
library, so that it is tested on machines without torch or a GPU; the fixture
`tests/task-keys.jsonl` is read by both this package's tests and the Rust CLI's, so the
two sides cannot drift apart.
"""

import dataclasses
import json
import re

DTYPES = ("f32", "tf32", "fp16", "bf16")
LAYOUTS = ("nchw", "nhwc")
OPERATORS = ("conv2d", "matmul", "batch_matmul")
CONV_FIELDS = ("n", "c", "h", "w", "k", "r", "s", "stride_h", "stride_w", "pad_h",
               "pad_w", "dilation_h", "dilation_w", "groups")
DIMS = {"conv2d": CONV_FIELDS, "matmul": ("m", "n", "k"),
        "batch_matmul": ("b", "m", "n", "k")}
# The largest value a dimension may take: the Rust side holds them in 32 bits.
MAX_DIM = (1 << 32) - 1


class TaskError(ValueError):
    """A key or task that tilesched cannot name or does not know."""


@dataclasses.dataclass(frozen=True)
class Task:
    """One operator shape with its epilogue, element types and layout.

    `dims` maps the operator's fields (`DIMS[op]`) to positive integers (pads may be 0).
    `out_dtype` is f32 or `dtype`; `layout` is meaningful for conv2d only (matmuls are
    row-major and always written "nchw", as in Rust).
    """

    op: str
    dims: tuple  # ((name, value), ...) in DIMS[op] order, hashable
    bias: bool = False
    relu: bool = False
    dtype: str = "f32"
    out_dtype: str = "f32"
    layout: str = "nchw"

    def __post_init__(self):
        if self.op not in OPERATORS:
            raise TaskError(f"unknown operator {self.op!r} (known: {', '.join(OPERATORS)})")
        names = tuple(name for name, _ in self.dims)
        if names != DIMS[self.op]:
            raise TaskError(f"{self.op} takes fields {DIMS[self.op]}, got {names}")
        for name, value in self.dims:
            floor = 0 if name in ("pad_h", "pad_w") else 1
            if isinstance(value, bool) or not isinstance(value, int) or not floor <= value <= MAX_DIM:
                raise TaskError(f"{self.op} field {name} must be an integer >= {floor}, got {value!r}")
        if self.dtype not in DTYPES or self.out_dtype not in DTYPES:
            raise TaskError(f"unknown dtype in {self.dtype!r}/{self.out_dtype!r} (known: {', '.join(DTYPES)})")
        if self.out_dtype not in ("f32", self.dtype):
            raise TaskError(f"output type {self.out_dtype} must be f32 or the input type {self.dtype}")
        if self.layout not in LAYOUTS:
            raise TaskError(f"unknown layout {self.layout!r} (known: {', '.join(LAYOUTS)})")
        if self.op != "conv2d" and self.layout != "nchw":
            raise TaskError(f"{self.op} is row-major: its layout is nchw, not {self.layout}")
        if self.op == "conv2d":
            d = self.d
            if d["c"] % d["groups"] or d["k"] % d["groups"]:
                raise TaskError(f"conv2d: {d['groups']} groups do not divide C={d['c']} and K={d['k']}")
            p, q = self.output_hw()
            if p < 1 or q < 1:
                raise TaskError(f"conv2d: the window does not fit the padded input (output {p}x{q})")

    @property
    def d(self):
        """The fields as a dict."""
        return dict(self.dims)

    @staticmethod
    def conv2d(n, c, h, w, k, r, s, stride=(1, 1), pad=(0, 0), dilation=(1, 1), groups=1, **rest):
        dims = dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride_h=stride[0], stride_w=stride[1],
                    pad_h=pad[0], pad_w=pad[1], dilation_h=dilation[0], dilation_w=dilation[1],
                    groups=groups)
        return Task("conv2d", tuple((f, dims[f]) for f in CONV_FIELDS), **rest)

    @staticmethod
    def matmul(m, n, k, **rest):
        return Task("matmul", (("m", m), ("n", n), ("k", k)), **rest)

    @staticmethod
    def batch_matmul(b, m, n, k, **rest):
        return Task("batch_matmul", (("b", b), ("m", m), ("n", n), ("k", k)), **rest)

    def output_hw(self):
        """conv2d's output height and width."""
        d = self.d
        span_h = d["dilation_h"] * (d["r"] - 1) + 1
        span_w = d["dilation_w"] * (d["s"] - 1) + 1
        p = (d["h"] + 2 * d["pad_h"] - span_h) // d["stride_h"] + 1
        q = (d["w"] + 2 * d["pad_w"] - span_w) // d["stride_w"] + 1
        return p, q

    def key(self):
        """The deploy cache's and the log's name of this task."""
        d = self.d

        def pair(a, b):
            return str(a) if a == b else f"{a}x{b}"

        if self.op == "conv2d":
            key = (f"conv2d_n{d['n']}_c{d['c']}_h{d['h']}_w{d['w']}_k{d['k']}_r{d['r']}_s{d['s']}"
                   f"_st{pair(d['stride_h'], d['stride_w'])}_p{pair(d['pad_h'], d['pad_w'])}")
            if (d["dilation_h"], d["dilation_w"]) != (1, 1):
                key += f"_d{pair(d['dilation_h'], d['dilation_w'])}"
            if d["groups"] != 1:
                key += f"_g{d['groups']}"
        elif self.op == "matmul":
            key = f"matmul_m{d['m']}_n{d['n']}_k{d['k']}"
        else:
            key = f"batch_matmul_b{d['b']}_m{d['m']}_n{d['n']}_k{d['k']}"
        if self.bias:
            key += "_bias"
        if self.relu:
            key += "_relu"
        if self.dtype != "f32":
            key += f"_{self.dtype}"
        if self.out_dtype != "f32":
            key += f"_out_{self.out_dtype}"
        if self.layout != "nchw":
            key += f"_{self.layout}"
        return key

    def to_json(self):
        """The task as tilesched's Rust side serializes it (types left out at f32/NCHW)."""
        out = {"op": self.op}
        for name, value in self.dims:
            if name == "groups" and value == 1:
                continue
            out[name] = value
        out["epilogue"] = {"bias": self.bias, "relu": self.relu}
        if self.dtype != "f32":
            out["dtype"] = self.dtype
        if self.out_dtype != "f32":
            out["out_dtype"] = self.out_dtype
        if self.layout != "nchw":
            out["layout"] = self.layout
        return out

    def output_shape(self):
        """The output's logical shape: [N, K, P, Q] for conv2d (whatever the layout:
        NHWC is a channels_last tensor of that shape), [M, N], [B, M, N]."""
        d = self.d
        if self.op == "conv2d":
            return [d["n"], d["k"], *self.output_hw()]
        if self.op == "matmul":
            return [d["m"], d["n"]]
        return [d["b"], d["m"], d["n"]]


_NUM = r"(\d+)"
_PAIR = r"(\d+)(?:x(\d+))?"
_CONV = re.compile(
    rf"conv2d_n{_NUM}_c{_NUM}_h{_NUM}_w{_NUM}_k{_NUM}_r{_NUM}_s{_NUM}_st{_PAIR}_p{_PAIR}"
    rf"(?:_d{_PAIR})?(?:_g{_NUM})?")
_MATMUL = re.compile(rf"matmul_m{_NUM}_n{_NUM}_k{_NUM}")
_BATCH = re.compile(rf"batch_matmul_b{_NUM}_m{_NUM}_n{_NUM}_k{_NUM}")
_SUFFIX = re.compile(r"(_bias)?(_relu)?(?:_(tf32|fp16|bf16))?(?:_out_(tf32|fp16|bf16))?(?:_(nhwc))?")


def parse_key(key):
    """The task a key names; `TaskError` for a key tilesched does not write (asymmetric
    end pads, `_pe`, are not taken: PyTorch's Conv2d pads symmetrically)."""
    for op, pattern in (("batch_matmul", _BATCH), ("matmul", _MATMUL), ("conv2d", _CONV)):
        head = pattern.match(key)
        if head:
            break
    else:
        raise TaskError(f"{key!r} is not a task key (conv2d_..., matmul_..., batch_matmul_...)")
    tail = _SUFFIX.fullmatch(key, head.end())
    if not tail:
        raise TaskError(f"{key!r}: cannot read {key[head.end():]!r} after its shape")
    g = head.groups()
    if op == "conv2d":
        n, c, h, w, k, r, s = (int(x) for x in g[:7])

        def pair(a, b):
            return (int(a), int(b if b is not None else a))

        task_dims = dict(stride=pair(g[7], g[8]), pad=pair(g[9], g[10]),
                         dilation=pair(g[11], g[12]) if g[11] else (1, 1),
                         groups=int(g[13]) if g[13] else 1)
        make = lambda **rest: Task.conv2d(n, c, h, w, k, r, s, **task_dims, **rest)  # noqa: E731
    elif op == "matmul":
        make = lambda **rest: Task.matmul(*(int(x) for x in g), **rest)  # noqa: E731
    else:
        make = lambda **rest: Task.batch_matmul(*(int(x) for x in g), **rest)  # noqa: E731
    bias, relu, dtype, out_dtype, layout = tail.groups()
    task = make(bias=bool(bias), relu=bool(relu), dtype=dtype or "f32",
                out_dtype=out_dtype or "f32", layout=layout or "nchw")
    if task.key() != key:
        raise TaskError(f"{key!r} is not written the way tilesched writes it: {task.key()!r}")
    return task


def task_line(task, count):
    """One line of a task list (`tilesched tune --tasks FILE`)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TaskError(f"a task's count must be a positive integer, got {count!r}")
    return json.dumps({"key": task.key(), "task": task.to_json(), "count": count})


def write_task_list(path, workloads):
    """Writes `(task, count)` pairs as a task list; a task given twice is counted once
    with the counts added."""
    counts = {}
    for task, count in workloads:
        counts[task] = counts.get(task, 0) + count
    with open(path, "w", encoding="utf-8") as f:
        for task, count in counts.items():
            f.write(task_line(task, count) + "\n")


def read_task_list(path):
    """The `(task, count)` pairs of a task list, each key checked against its task."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                task = task_from_json(item["task"])
                count = item["count"]
                key = item["key"]
            except (ValueError, KeyError, TypeError) as e:
                raise TaskError(f"{path}:{number}: {e}") from None
            if task.key() != key:
                raise TaskError(f"{path}:{number}: key {key} does not name its task, {task.key()}")
            out.append((task, count))
    return out


def task_from_json(obj):
    """A task from tilesched's JSON (the inverse of `Task.to_json`)."""
    op = obj["op"]
    if op not in DIMS:
        raise TaskError(f"unknown operator {op!r}")
    fields = dict(obj)
    fields.pop("op")
    epilogue = fields.pop("epilogue", {}) or {}
    rest = dict(bias=bool(epilogue.get("bias", False)), relu=bool(epilogue.get("relu", False)),
                dtype=fields.pop("dtype", "f32"), out_dtype=fields.pop("out_dtype", "f32"),
                layout=fields.pop("layout", "nchw"))
    if op == "conv2d":
        fields.setdefault("groups", 1)
        if fields.pop("pad_bottom", None) is not None or fields.pop("pad_right", None) is not None:
            raise TaskError("conv2d with asymmetric end pads is not taken from PyTorch")
    unknown = set(fields) - set(DIMS[op])
    if unknown:
        raise TaskError(f"{op}: unknown fields {sorted(unknown)}")
    missing = [f for f in DIMS[op] if f not in fields]
    if missing:
        raise TaskError(f"{op}: missing fields {missing}")
    return Task(op, tuple((f, fields[f]) for f in DIMS[op]), **rest)
