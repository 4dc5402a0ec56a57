"""Handing a rank's verified windows to a serving engine's own weight loaders, engine-independent.

Engines load a checkpoint by giving each parameter's ``weight_loader`` the *whole* stored tensor,
which narrows it to this rank's part (``loaded_weight.narrow(dim, tp_rank * size, size)``).
tpload reads only the window, so it hands over a :class:`WindowTensor`: a tensor with the
stored tensor's full shape and dtype whose only readable bytes are the window. Narrowing it
inside the window returns those verified bytes; anything else (a range outside the window, an
arithmetic op, a copy of the whole) raises :class:`HandoffError` naming the tensor, the rank, the
range asked and the range held. So the engine's own name mapping, fusing (q/k/v, gate/up) and
sharding logic run unchanged, host memory stays at the windows, and a sharding rule that
disagrees with the engine's fails the start instead of serving bytes that were never verified.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import torch

from ..codecs import Cut
from ..errors import LoadError
from ..storage.catalogue import natural_key
from ..storage.safetensors import TensorMeta

Range = tuple[int, int]


class HandoffError(LoadError):
    """The engine asked a window for bytes this rank does not hold (or for an op on all of them)."""


# Metadata an engine may read from a loaded weight (shapes, dtype, device), never its values.
_METADATA = frozenset({"size", "dim", "numel", "__len__", "__get__", "element_size", "nelement", "is_floating_point",
                       "get_device", "is_contiguous", "__format__"})


class WindowTensor(torch.Tensor):
    """A stored tensor's full shape over this rank's window of it (see the module docstring)."""

    _window: torch.Tensor
    _box: tuple[Range, ...]
    _label: str

    @staticmethod
    def __new__(cls, window: torch.Tensor, full: Sequence[int], box: Sequence[Range], label: str) -> WindowTensor:
        t = torch.Tensor._make_wrapper_subclass(cls, tuple(full), dtype=window.dtype, device=window.device)
        t._window, t._box, t._label = window, tuple(box), label
        return t

    def __repr__(self, *args: object, **kwargs: object) -> str:
        box = ", ".join(f"{lo}:{hi}" for lo, hi in self._box)
        return f"WindowTensor({self._label}, shape {tuple(self.shape)}, holds [{box}])"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206 (torch's protocol)
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func in (torch.Tensor.narrow, torch.narrow):
            return _narrow(*args, **kwargs)
        if func is torch.Tensor.__getitem__:
            return _getitem(*args)
        if func is torch.Tensor.__repr__:
            return args[0].__repr__()
        if name in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        self = next(a for a in args if isinstance(a, WindowTensor))
        raise HandoffError(f"{self._label}: the engine's weight loader called {name or func} on the whole tensor; "
                           f"this rank holds only {_ranges(self._box)} of {tuple(self.shape)} (tpload hands over "
                           "windows; a loader must narrow to its part first)")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        raise HandoffError(f"the engine ran {func} on a tpload window (only narrowing to the window is served)")


def _ranges(box: Sequence[Range]) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"


def _narrow(t: WindowTensor, dim: int, start: int, length: int) -> torch.Tensor:
    """``t.narrow(dim, start, length)``: inside the window, its bytes (a plain tensor once every
    dimension is inside it); across its edge, a HandoffError."""
    dim = dim % t.dim()
    start = int(start)
    lo, hi = t._box[dim]
    if start < lo or start + length > hi:
        raise HandoffError(f"{t._label}: the engine asked for [{start}:{start + length}] of dimension {dim}; this "
                           f"rank holds {_ranges(t._box)} of {tuple(t.shape)}: its sharding differs from the "
                           "config's rule for this tensor (docs/engines.md)")
    window = t._window.narrow(dim, start - lo, length)
    box, full = list(t._box), list(t.shape)
    full[dim] = length
    box[dim] = (0, length)
    if all(b == (0, n) for b, n in zip(box, full)):
        return window
    return WindowTensor(window, full, box, t._label)


def _getitem(t: WindowTensor, index: object) -> torch.Tensor:
    """Basic slicing (``t[a:b]``, ``t[:, a:b]``) as successive narrows; anything else is refused."""
    parts = index if isinstance(index, tuple) else (index,)
    out: torch.Tensor = t
    for dim, s in enumerate(parts):
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise HandoffError(f"{t._label}: the engine indexed the whole tensor with {index!r}; this rank holds "
                               f"{_ranges(t._box)} of {tuple(t.shape)}")
        start, stop, _ = s.indices(t.shape[dim])
        out = out.narrow(dim, start, max(0, stop - start))
    return out


def box_of(cut: Cut, meta: TensorMeta) -> tuple[Range, ...]:
    """The window of ``cut`` as an element range per dimension of the stored tensor ``meta``.

    The cut is a box of a 2-D byte view; a tensor-parallel window is a range of one dimension, so
    its first element's position in the whole tensor says where the range starts."""
    full, size = tuple(meta.shape), meta.itemsize
    if tuple(cut.shape) == full:
        return tuple((0, n) for n in full)
    view_row = cut.view[1]
    first = (cut.rows[0] * view_row + cut.cols[0]) // size
    index, rest = [], first
    for n in reversed(full):
        rest, i = divmod(rest, n)
        index.append(i)
    index.reverse()
    box = tuple((i, i + w) for i, w in zip(index, cut.shape))
    cut_dims = [d for d, (w, n) in enumerate(zip(cut.shape, full)) if w != n]
    if len(cut.shape) != len(full) or any(index[d] for d in range(len(full)) if d not in cut_dims) or \
            math.prod(cut.shape) * size != cut.nbytes:
        raise LoadError(f"{meta.name}: its window {_ranges(box)} of {full} is not a range of one dimension; "
                        "an engine hand-off takes tensor-parallel windows only")
    return box


def checkpoint_order(file: str, name: str) -> tuple:
    """Where a tensor comes in vLLM's default loader: files in natural order (``-00002-`` before
    ``-00010-``), names sorted within a file (safetensors' ``keys()``)."""
    return natural_key(file), name


def windows(state: Mapping[str, torch.Tensor], plan_items: Sequence, *, rank: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(stored name, tensor) for every served tensor of a packed load: a private copy of the window
    (engines' loaders may write into what they are handed), as a :class:`WindowTensor` of the full
    shape where the window is a part.

    In the checkpoint's order, as the engine's own loader would hand them, so that nothing an engine
    does in the order weights arrive differs from its own load."""
    cuts = []
    for item in plan_items:
        metas = {m.name: m for m in (item.fit.weight, item.fit.scale, item.fit.scale2) if m is not None}
        cuts += [(checkpoint_order(metas[c.name].file, c.name), c, metas[c.name]) for c in item.cuts]
    for _, cut, meta in sorted(cuts, key=lambda x: x[0]):
        window = state[cut.name].clone()
        if tuple(cut.shape) == tuple(meta.shape):
            yield cut.name, window
        else:
            yield cut.name, WindowTensor(window, meta.shape, box_of(cut, meta), f"{cut.name} (rank {rank})")


def engine_skips(model_config: Mapping[str, object]) -> tuple[str, ...]:
    """Tensors a serving engine's main model never loads, from its config.json: the MTP layers of
    DeepSeek-V3-style checkpoints (``model.layers.{num_hidden_layers + i}``; engines load them
    only into a separate draft model)."""
    layers, mtp = model_config.get("num_hidden_layers"), model_config.get("num_nextn_predict_layers")
    if not isinstance(layers, int) or not isinstance(mtp, int):
        return ()
    return tuple(f"model.layers.{layers + i}.*" for i in range(mtp))
