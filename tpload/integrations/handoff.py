"""Handing a rank's verified windows to a serving engine's own weight loaders, engine-independent.

Engines load a checkpoint by giving each parameter's ``weight_loader`` the *whole* stored tensor,
which narrows it to this rank's part (``loaded_weight.narrow(dim, tp_rank * size, size)``).
tpload reads only the window, so it hands over a :class:`WindowTensor`: a tensor with the
stored tensor's full shape and dtype whose only readable bytes are the window. It is an
allow-list: shape queries, and ``narrow`` or basic slicing inside the window (which return those
verified bytes) are served; every other access raises :class:`HandoffError` naming the tensor, the
rank and the access. That covers a range outside the window, arithmetic, a copy of the whole,
any torch function with a window anywhere in its arguments (``torch.cat([w, x])``), and every way
to its memory (DLPack, ``__array__``, ``numpy()``, storages, ``data_ptr``), including C code that
bypasses ``__torch_function__``: the window has no storage of its own, and its sizes and strides
are answered only to Python (C callers such as ``torch.utils.dlpack.to_dlpack`` ask the
dispatcher for them, and are refused there). So the engine's own name mapping, fusing (q/k/v,
gate/up) and sharding logic run unchanged, host memory stays at the windows, and a sharding rule
that disagrees with the engine's fails the start instead of serving bytes never verified.

Tensors handed whole (replicated, or unsplit at this TP size) are :class:`WholeTensor`: real
tensors on which every op is served. Both kinds record what the engine read, in a
:class:`Handoff`; after the engine's ``load_weights`` returns, every handed tensor must have been
read whole (a window: narrows that together cover it; a whole tensor: any op other than a
metadata query) unless the engine integration declared it skipped on purpose (:class:`Skip`).
That closes the class of bug where a loader silently drops weights (a name it does not map, an
iteration cut short), whatever the engine checks itself: vLLM, for one, checks nothing for
quantized models.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

from ..codecs import Cut
from ..errors import LoadError
from ..storage.catalogue import natural_key
from ..storage.safetensors import TensorMeta
from ..torch_private import torch_function_off, tree_leaves

Range = tuple[int, int]
Box = tuple[Range, ...]


class HandoffError(LoadError):
    """The engine asked a handed tensor for bytes this rank does not hold, or accessed it in a way
    the hand-off does not serve."""


# -- what the engine read
# -----------------------------------------------------------------------------


class Handed:
    """One tensor handed to the engine: the box of the stored tensor this rank holds (element
    ranges, stored coordinates) and the boxes the engine read of it."""

    __slots__ = ("name", "box", "reads", "taken", "whole")

    def __init__(self, name: str, box: Box, *, whole: bool) -> None:
        self.name, self.box, self.whole = name, box, whole
        self.reads: set[Box] = set()
        self.taken = False

    def read(self, box: Box | None = None) -> None:
        """The engine got these bytes (None: all of them)."""
        self.reads.add(self.box if box is None else box)

    @property
    def consumed(self) -> bool:
        return self.box in self.reads or (bool(self.reads) and _covers(self.box, list(self.reads)))

    def what(self) -> str:
        """Why it is not consumed, in a few words."""
        if not self.taken:
            return "never taken from the weights iterator"
        if not self.reads:
            return "taken, never read" + (
                "" if self.whole else f" (this rank holds {_ranges(self.box)})"
            )
        parts = ", ".join(sorted(_ranges(b) for b in self.reads)[:4])
        return f"only {parts} read of the {_ranges(self.box)} this rank holds"


def _covers(box: Box, parts: list[Box], dim: int = 0) -> bool:
    """Whether the union of ``parts`` covers ``box``: a sweep along ``dim``, each slab between two
    part edges covered in the remaining dimensions by the parts that span it."""
    if dim == len(box):
        return bool(parts)
    lo, hi = box[dim]
    edges = sorted({lo, hi} | {min(max(e, lo), hi) for p in parts for e in p[dim]})
    for a, b in pairwise(edges):
        spanning = [p for p in parts if p[dim][0] <= a and b <= p[dim][1]]
        if not spanning or not _covers(box, spanning, dim + 1):
            return False
    return True


@dataclass(frozen=True)
class Skip:
    """Tensors an engine's ``load_weights`` ignores on purpose, declared by its integration.

    ``read``: False for tensors tpload never reads (the engine has no parameter for them, e.g. MTP
    layers; they become load skips); True for tensors handed over anyway, whose consumption is not
    required (e.g. a tied ``lm_head``, which the engine may or may not read)."""

    glob: str
    reason: str
    read: bool

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.glob)


def declared_skips(model_config: Mapping[str, object]) -> tuple[Skip, ...]:
    """What vLLM's (and SGLang's, which follows it) Llama/Qwen/DeepSeek ``load_weights`` skip, from
    the model's config (the engine's config object as a dict, so class defaults are included):

    * the MTP layers ``model.layers.{num_hidden_layers + i}`` (DeepSeek-V3 style): the main model
      has no parameter for them; engines load them only into a separate draft model;
    * ``lm_head.*`` when ``tie_word_embeddings``: the head is the embedding (``skip_prefixes``);
    * rotary tables (``rotary_emb.inv_freq``, ``cos_cached``, ``sin_cached``): computed, never
      loaded.
    """
    out = []
    layers, mtp = (
        model_config.get("num_hidden_layers"),
        model_config.get("num_nextn_predict_layers"),
    )
    if isinstance(layers, int) and isinstance(mtp, int) and not isinstance(mtp, bool):
        out += [
            Skip(
                f"model.layers.{layers + i}.*",
                f"MTP layer {layers + i} (num_hidden_layers is {layers}): "
                "loaded only into a draft model, never read",
                read=False,
            )
            for i in range(max(0, mtp))
        ]
    if model_config.get("tie_word_embeddings") is True:
        out.append(
            Skip(
                "lm_head.*", "tie_word_embeddings: the engine's lm_head is embed_tokens", read=True
            )
        )
    out += [
        Skip(f"*.rotary_emb.{t}", "rotary tables: the engine computes them", read=True)
        for t in ("inv_freq", "cos_cached", "sin_cached")
    ]
    return tuple(out)


def engine_skips(model_config: Mapping[str, object]) -> tuple[str, ...]:
    """The load skips of :func:`declared_skips`: the globs tpload never reads."""
    return tuple(s.glob for s in declared_skips(model_config) if not s.read)


# -- the tensors handed over
# ------------------------------------------------------------------------

# Queries of a tensor's metadata: answered, and never a read.
_QUERIES = frozenset(
    {
        "size",
        "dim",
        "numel",
        "nelement",
        "__len__",
        "element_size",
        "is_floating_point",
        "is_complex",
        "get_device",
        "is_contiguous",
        "stride",
        "__format__",
        "__repr__",
        "__hash__",
        "__get__",
        "is_signed",
        "is_inference",
        "type",
    }
)
# Attributes a window serves (metadata); any other (``.data``, ``.T``, ``.real``, ...) is refused.
_ATTRIBUTES = frozenset(
    {
        "shape",
        "ndim",
        "nbytes",
        "itemsize",
        "dtype",
        "device",
        "layout",
        "requires_grad",
        "is_leaf",
        "grad",
        "grad_fn",
        "_grad",
        "_grad_fn",
        "name",
        "output_nr",
        "retains_grad",
        "_version",
        "_has_symbolic_sizes_strides",
        "_python_dispatch",
        "_base",
        "_cdata",
        "grad_dtype",
        "volatile",
        "is_cpu",
        "is_cuda",
        "is_ipu",
        "is_maia",
        "is_meta",
        "is_mkldnn",
        "is_mps",
        "is_mtia",
        "is_nested",
        "is_quantized",
        "is_sparse",
        "is_sparse_csr",
        "is_vulkan",
        "is_xla",
        "is_xpu",
    }
)


def _access(func: Callable) -> str:
    """How the engine's call reads in a message: ``torch.cat``, ``Tensor.numpy``, ``attribute
    .data``."""
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", "") in ("__get__", "__set__") and owner is not None:
        attr = getattr(owner, "__name__", None) or getattr(
            getattr(owner, "fget", None), "__name__", "?"
        )
        return f"attribute .{attr}" + (" (set)" if func.__name__ == "__set__" else "")
    name = getattr(func, "__name__", None) or repr(func)
    for prefix, where in (
        ("torch.", torch),
        ("Tensor.", torch.Tensor),
        ("torch.nn.functional.", torch.nn.functional),
    ):
        if getattr(where, name, None) is func:
            return prefix + name
    return f"{getattr(func, '__module__', None) or 'torch'}.{getattr(func, '__qualname__', name)}"


def _attribute(func: Callable) -> str | None:
    """The attribute a getter reads (None when ``func`` is no getter)."""
    if getattr(func, "__name__", "") != "__get__":
        return None
    owner = getattr(func, "__self__", None)
    return (
        getattr(owner, "__name__", None)
        or getattr(getattr(owner, "fget", None), "__name__", None)
        or "?"
    )


def _windows_in(args: object) -> list[WindowTensor]:
    return [a for a in tree_leaves(args) if isinstance(a, WindowTensor)]


class WindowTensor(torch.Tensor):
    """A stored tensor's full shape over this rank's window of it (see the module docstring)."""

    _window: torch.Tensor
    _box: Box
    _label: str
    _handed: Handed | None
    _origin: tuple[int, ...]
    _full: torch.Size

    @staticmethod
    def __new__(
        cls,
        window: torch.Tensor,
        full: Sequence[int],
        box: Sequence[Range],
        label: str,
        *,
        handed: Handed | None = None,
        origin: Sequence[int] | None = None,
    ) -> WindowTensor:
        # "sizes": sizes, strides and numel come from Python (answered below, in
        # __torch_function__); C code that reads them (DLPack export, an extension) reaches
        # __torch_dispatch__ and is refused.
        t = torch.Tensor._make_wrapper_subclass(
            cls,
            tuple(full),
            dtype=window.dtype,
            device=window.device,
            dispatch_sizes_strides_policy="sizes",
        )
        t._window, t._box, t._label = window, tuple(box), label
        t._handed, t._origin = handed, tuple(origin) if origin is not None else (0,) * len(full)
        t._full = torch.Size(full)
        return t

    def __repr__(self, *args: object, **kwargs: object) -> str:
        return f"WindowTensor({self._label}, shape {tuple(self._full)}, holds {_ranges(self._box)})"

    __str__ = __repr__

    def _refuse(self, access: str) -> HandoffError:
        return HandoffError(
            f"{self._label}: the engine's weight loader used {access} on the whole tensor; this "
            f"rank holds only {_ranges(self._box)} of {tuple(self._full)} (tpload hands over "
            "windows: a loader may read shapes and narrow to its part, nothing else)"
        )

    # Python-level ways to the bytes, refused here whatever __torch_function__ would do with them.
    def __dlpack__(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("__dlpack__ (DLPack export)")

    def __dlpack_device__(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("__dlpack_device__ (DLPack export)")

    def __array__(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("__array__ (conversion to numpy)")

    def __array_wrap__(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("__array_wrap__ (numpy)")

    def numpy(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("numpy()")

    def tolist(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("tolist()")

    def item(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("item()")

    def untyped_storage(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("untyped_storage()")

    def storage(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("storage()")

    def _typed_storage(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("_typed_storage()")

    def data_ptr(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("data_ptr()")

    def __reduce_ex__(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("pickling")

    def __deepcopy__(self, *args: object, **kwargs: object) -> object:
        raise self._refuse("copy.deepcopy")

    @property
    def __cuda_array_interface__(self) -> object:
        raise self._refuse("__cuda_array_interface__")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206 (torch's protocol)
        kwargs = kwargs or {}
        try:
            return cls._serve(func, args, kwargs)
        except (
            StopIteration
        ):  # never let it out: under map() it would silently end the engine's iteration
            raise HandoffError(
                f"the engine's weight loader called {_access(func)} on a tpload window "
                "(StopIteration inside the hand-off)"
            ) from None

    @classmethod
    def _serve(cls, func: Callable, args: tuple, kwargs: dict) -> object:
        windows = _windows_in((args, kwargs))
        if (
            not windows
        ):  # pragma: no cover - torch calls this only with a window among the arguments
            with torch_function_off():
                return func(*args, **kwargs)
        self = args[0] if args and isinstance(args[0], WindowTensor) else None
        if self is None or len(windows) > 1 or windows[0] is not self:
            raise windows[0]._refuse(
                _access(func)
            )  # a window as an argument of someone else's call
        if func in (torch.Tensor.narrow, torch.narrow):
            return _narrow(*args, **kwargs)
        if func is torch.Tensor.__getitem__ and not kwargs:
            return _getitem(*args)
        name = getattr(func, "__name__", "")
        answer = self._query(func, name, args[1:], kwargs)
        if answer is not _REFUSED:
            return answer
        raise self._refuse(_access(func))

    def _query(self, func: Callable, name: str, args: tuple, kwargs: dict) -> object:
        """Metadata the window serves, as the whole tensor's; _REFUSED for anything else."""
        full = self._full
        attr = _attribute(func)
        if attr is not None:
            if attr == "shape":
                return full
            if attr == "ndim":
                return len(full)
            if attr == "nbytes":
                return math.prod(full) * self.dtype.itemsize
            if attr in _ATTRIBUTES:
                with torch_function_off():
                    out = func(self, *args, **kwargs)
                return _REFUSED if isinstance(out, torch.Tensor) else out
            return _REFUSED
        if name == "size":
            dim = args[0] if args else kwargs.get("dim")
            return full if dim is None else full[dim]
        if name == "dim" and not args:
            return len(full)
        if name in ("numel", "nelement"):
            return math.prod(full)
        if name == "__len__":
            if not full:
                raise TypeError("len() of a 0-d tensor")
            return full[0]
        if name == "stride":
            strides = _contiguous(full)
            dim = args[0] if args else kwargs.get("dim")
            return strides if dim is None else strides[dim]
        if name == "is_contiguous":
            return True
        if name == "__hash__":
            return id(self)
        if name == "__format__":
            return format(repr(self), *args)
        if name == "__repr__":
            return repr(self)
        if name in ("element_size", "is_floating_point", "is_complex", "get_device", "is_signed"):
            with torch_function_off():
                return func(self, *args, **kwargs)
        return _REFUSED

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        # Reached only from C (Python calls end in __torch_function__): the window's sizes or bytes
        # asked for by code that did not go through the allow-list, e.g.
        # torch.utils.dlpack.to_dlpack.
        windows = _windows_in((args, kwargs or {}))
        if not windows:  # pragma: no cover
            raise HandoffError(
                f"the engine ran {func} on a tpload window (only narrowing to the window is served)"
            )
        raise windows[0]._refuse(
            f"{func} from C code (e.g. torch.utils.dlpack.to_dlpack, or an extension that "
            "reads the tensor's memory)"
        )


_REFUSED = object()


def _contiguous(full: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(full):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class WholeTensor(torch.Tensor):
    """A tensor handed whole: a real tensor (every op is served, results are plain tensors), whose
    reads are recorded: any op other than a metadata query, or one that returns a tensor."""

    _handed: Handed

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206 (torch's protocol)
        kwargs = kwargs or {}
        with torch_function_off():
            out = func(*args, **kwargs)
        if getattr(func, "__name__", "") not in _QUERIES or any(
            isinstance(o, torch.Tensor) for o in tree_leaves(out)
        ):
            for leaf in tree_leaves((args, kwargs)):
                if isinstance(leaf, WholeTensor):
                    leaf._handed.read()
        return out


def whole_tensor(tensor: torch.Tensor, handed: Handed) -> WholeTensor:
    t = tensor.as_subclass(WholeTensor)
    t._handed = handed
    return t


def _ranges(box: Sequence[Range]) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"


def _narrow(t: WindowTensor, dim: int, start: int, length: int) -> torch.Tensor:
    """``t.narrow(dim, start, length)`` (see :func:`_take`)."""
    return _take(
        t,
        {dim % len(t._full): (int(start), int(length))},
        f"[{int(start)}:{int(start) + int(length)}] of dimension {dim % len(t._full)}",
    )


def _getitem(t: WindowTensor, index: object) -> torch.Tensor:
    """Basic slicing (``t[a:b]``, ``t[:, a:b]``, ``t[:, a:b, ...]``) as one narrow per dimension;
    anything else (an integer, a mask, ``None``) is refused."""
    parts = index if isinstance(index, tuple) else (index,)
    dots = [i for i, p in enumerate(parts) if p is Ellipsis]
    if len(dots) == 1:  # gpt-oss's loaders slice so: the dimensions it stands for, whole
        at = dots[0]
        parts = (
            parts[:at] + (slice(None),) * max(0, len(t._full) - len(parts) + 1) + parts[at + 1 :]
        )
    ranges = {}
    for dim, s in enumerate(parts):
        if not isinstance(s, slice) or s.step not in (None, 1) or dim >= len(t._full):
            raise HandoffError(
                f"{t._label}: the engine indexed the whole tensor with {index!r}; this rank holds "
                f"{_ranges(t._box)} of {tuple(t._full)}"
            )
        start, stop, _ = s.indices(t._full[dim])
        ranges[dim] = (start, max(0, stop - start))
    return _take(t, ranges, f"[{', '.join(f'{a}:{a + n}' for a, n in ranges.values())}]")


def _take(t: WindowTensor, ranges: Mapping[int, tuple[int, int]], asked: str) -> torch.Tensor:
    """The part ``ranges`` ({dim: (start, length)}) of ``t``: inside the window, its bytes (a plain
    tensor once every dimension is inside it, recorded as read; else a smaller window tensor);
    across the window's edge, a HandoffError."""
    window, box, full, origin = t._window, list(t._box), list(t._full), list(t._origin)
    for dim, (start, length) in ranges.items():
        lo, hi = box[dim]
        if start < lo or length < 0 or start + length > hi:
            raise HandoffError(
                f"{t._label}: the engine asked for {asked}; this rank holds {_ranges(t._box)} of "
                f"{tuple(t._full)}: its sharding differs from the config's rule for this tensor "
                "(docs/engines.md)"
            )
        window = window.narrow(dim, start - lo, length)
        full[dim], box[dim] = length, (0, length)
        origin[dim] += start
    if all(b == (0, n) for b, n in zip(box, full, strict=False)):
        if t._handed is not None:
            t._handed.read(tuple((o, o + n) for o, n in zip(origin, full, strict=False)))
        return window
    return WindowTensor(window, full, box, t._label, handed=t._handed, origin=origin)


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
    box = tuple((i, i + w) for i, w in zip(index, cut.shape, strict=False))
    cut_dims = [d for d, (w, n) in enumerate(zip(cut.shape, full, strict=False)) if w != n]
    if (
        len(cut.shape) != len(full)
        or any(index[d] for d in range(len(full)) if d not in cut_dims)
        or math.prod(cut.shape) * size != cut.nbytes
    ):
        raise LoadError(
            f"{meta.name}: its window {_ranges(box)} of {full} is not a range of one dimension; "
            "an engine hand-off takes tensor-parallel windows only"
        )
    return box


def checkpoint_order(file: str, name: str) -> tuple:
    """Where a tensor comes in vLLM's default loader: files in natural order (``-00002-`` before
    ``-00010-``), names sorted within a file (safetensors' ``keys()``)."""
    return natural_key(file), name


class Handoff:
    """Everything one rank hands to an engine, in the order the engine's own loader would (files in
    natural order, names sorted within a file), and what the engine read of it.

    :meth:`tensors` yields (stored name, tensor): a private copy of each window (engines' loaders
    may write into what they are handed), as a :class:`WindowTensor` of the full shape where the
    window is a part, a :class:`WholeTensor` where it is the whole. :meth:`unconsumed` then says
    which were never read whole. Every tensor is registered before the first is yielded, so one
    the engine never took from the iterator counts too."""

    def __init__(
        self,
        state: Mapping[str, torch.Tensor],
        plan_items: Sequence,
        *,
        rank: int,
        rename: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """``rename``: {stored name: the names the engine expects it under} (the KV-cache scales'
        canonical names, kvscales.py); each name gets its own copy, and any of them being read
        counts."""
        self.state, self.rank, self.rename = state, rank, dict(rename or {})
        cuts = []
        for item in plan_items:
            metas = {
                m.name: m
                for m in (item.fit.weight, item.fit.scale, item.fit.scale2)
                if m is not None
            }
            cuts += [
                (checkpoint_order(metas[c.name].file, c.name), c, metas[c.name]) for c in item.cuts
            ]
        cuts.sort(key=lambda x: x[0])
        self.cuts = [(c, m) for _, c, m in cuts]
        self.handed: dict[str, Handed] = {}
        for cut, meta in self.cuts:
            whole = tuple(cut.shape) == tuple(meta.shape)
            box = tuple((0, n) for n in meta.shape) if whole else box_of(cut, meta)
            self.handed[cut.name] = Handed(cut.name, box, whole=whole)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for cut, meta in self.cuts:
            handed = self.handed[cut.name]
            window = self.state[cut.name].clone()
            handed.taken = True
            if handed.whole:
                for name in self.rename.get(cut.name, (cut.name,)):
                    yield name, whole_tensor(window if name == cut.name else window.clone(), handed)
            else:
                yield (
                    cut.name,
                    WindowTensor(
                        window,
                        meta.shape,
                        handed.box,
                        f"{cut.name} (rank {self.rank})",
                        handed=handed,
                    ),
                )

    def unconsumed(self, skips: Sequence[Skip] = ()) -> tuple[list[Handed], dict[str, list[str]]]:
        """(tensors not read whole and not declared, {declared skip's glob: the tensors it
        excused})."""
        missing, excused = [], {}
        for h in self.handed.values():
            if h.consumed:
                continue
            skip = next((s for s in skips if s.read and s.matches(h.name)), None)
            if skip is None:
                missing.append(h)
            else:
                excused.setdefault(skip.glob, []).append(h.name)
        return missing, excused


def unconsumed_message(missing: Sequence[Handed], engine: str) -> str:
    """One line naming the tensors ``engine``'s loaders left unread (the first 8, then a count)."""
    shown = ", ".join(f"{h.name} ({h.what()})" for h in missing[:8])
    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    return (
        f"{len(missing)} tensor(s) tpload handed over were not consumed by {engine}'s weight "
        f"loaders: {shown}{more}; every handed tensor must be read, or be declared skipped on "
        "purpose by the engine integration (docs/engines.md)"
    )


def windows(
    state: Mapping[str, torch.Tensor], plan_items: Sequence, *, rank: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """:meth:`Handoff.tensors` of a hand-off whose reads nobody checks (tests, tools)."""
    return Handoff(state, plan_items, rank=rank).tensors()
