"""tilesched for PyTorch: tuned kernels from a deploy cache as PyTorch operators.

- `tilesched.ops`: the custom operators `torch.ops.tilesched.{conv2d,matmul,batch_matmul}`,
  which launch a deploy cache's kernel on PyTorch tensors and PyTorch's current stream
  (eager, `torch.compile` graphs, CUDA-graph capture);
- `tilesched.torch`: `optimize(model, deploy_dir, example_inputs)` swaps a model's
  convolutions (BatchNorm folded, ReLU fused), Linear layers, self-attention projections
  and matmuls for those operators where the cache has their kernels, and
  `tasks(model, example_inputs)` lists the tasks to tune for a model;
- `tilesched.keys`: task keys and task lists, pure Python.

The native part (`tilesched._native`, Rust over the `runtime` crate) is imported only
when a cache is opened, so the pure parts work without it.
"""

import functools
import os

from .keys import Task, TaskError, parse_key, read_task_list, write_task_list

__all__ = ["Task", "TaskError", "parse_key", "read_task_list", "write_task_list", "open_cache",
           "TileschedError"]


class TileschedError(RuntimeError):
    """A deploy cache or kernel that cannot be used (the native module's errors are
    this type's subclass once it is loaded)."""


def native():
    """The native module, or an error saying how to get it."""
    try:
        from . import _native
    except ImportError as e:
        raise TileschedError(
            f"tilesched's native module is not built ({e}); install the package with "
            "`pip install python/` (needs a Rust toolchain) or a built wheel") from None
    return _native


@functools.lru_cache(maxsize=None)
def _open(path, device):
    return native().Cache(path, device)


def open_cache(path, device=0):
    """The deploy cache in `path`, opened for GPU `device` (its entries for that GPU's
    name and compute capability); one per (path, device) per process."""
    if not os.path.isdir(path):
        raise TileschedError(f"no deploy cache at {path}: not a directory "
                             "(make one with `tilesched deploy add --log LOG --cache DIR`)")
    try:
        return _open(os.path.realpath(path), int(device))
    except native().TileschedError as e:
        raise TileschedError(str(e)) from None
