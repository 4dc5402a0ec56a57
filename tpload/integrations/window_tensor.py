"""The tensors handed to an engine's weight loaders. A :class:`WindowTensor` has the stored tensor's
full shape and serves only this rank's window of it (an allow-list: shape queries, and narrowing or
basic slicing inside the window; every other access raises :class:`HandoffError` naming the tensor,
the rank and the access, from Python or from C). A :class:`WholeTensor` is a real tensor handed
whole. Both record what the engine read in their :class:`~tpload.integrations.handed.Handed`
(handoff.py explains why)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import NoReturn

import torch

from ..distributed.torch_private import torch_function_off, tree_leaves
from .engine_objects import OpArgs, OpKwargs, OpResult, TorchOp
from .handed import ElementRanges, Handed, HandoffError, Range, ranges_text

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


def _access(func: TorchOp) -> str:
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


def _attribute(func: TorchOp) -> str | None:
    """The attribute a getter reads (None when ``func`` is no getter)."""
    if getattr(func, "__name__", "") != "__get__":
        return None
    owner = getattr(func, "__self__", None)
    return (
        getattr(owner, "__name__", None)
        or getattr(getattr(owner, "fget", None), "__name__", None)
        or "?"
    )


def _windows_in(args: OpArgs) -> list[WindowTensor]:
    return [a for a in tree_leaves(args) if isinstance(a, WindowTensor)]


def _refused(access: str) -> Callable[..., NoReturn]:
    """A method of :class:`WindowTensor` that refuses any call (whatever its arguments) in words."""

    def refuse(self: WindowTensor, *args: object, **kwargs: object) -> NoReturn:
        raise self._refuse(access)

    refuse.__name__ = refuse.__qualname__ = access.split(" ")[0].removesuffix("()")
    return refuse


class WindowTensor(torch.Tensor):
    """A stored tensor's full shape over this rank's window of it (see the module docstring)."""

    _window: torch.Tensor
    _held: ElementRanges
    _label: str
    _handed: Handed | None
    _origin: tuple[int, ...]
    _full: torch.Size

    @staticmethod
    def __new__(
        cls,
        window: torch.Tensor,
        full: Sequence[int],
        held: Sequence[Range],
        label: str,
        *,
        handed: Handed | None = None,
        origin: Sequence[int] | None = None,
    ) -> WindowTensor:
        # "sizes": sizes, strides and numel come from Python (answered below, in
        # __torch_function__); C code that reads them (DLPack export, an extension) reaches
        # __torch_dispatch__ and is refused.
        t: WindowTensor = torch.Tensor._make_wrapper_subclass(
            cls,
            tuple(full),
            dtype=window.dtype,
            device=window.device,
            dispatch_sizes_strides_policy="sizes",
        )
        t._window, t._held, t._label = window, tuple(held), label
        t._handed, t._origin = handed, tuple(origin) if origin is not None else (0,) * len(full)
        t._full = torch.Size(full)
        return t

    def __repr__(self, *, tensor_contents: str | None = None) -> str:  # torch's signature
        held = ranges_text(self._held)
        return f"WindowTensor({self._label}, shape {tuple(self._full)}, holds {held})"

    __str__ = __repr__

    def _refuse(self, access: str) -> HandoffError:
        return HandoffError(
            f"{self._label}: the engine's weight loader used {access} on the whole tensor; this "
            f"rank holds only {ranges_text(self._held)} of {tuple(self._full)} (tpload hands over "
            "windows: a loader may read shapes and narrow to its part, nothing else)"
        )

    # Python-level ways to the bytes, refused here whatever __torch_function__ would do with them
    # (pickle's protocol argument included: any call is refused in words).
    __dlpack__ = _refused("__dlpack__ (DLPack export)")
    __dlpack_device__ = _refused("__dlpack_device__ (DLPack export)")
    __array__ = _refused("__array__ (conversion to numpy)")
    __array_wrap__ = _refused("__array_wrap__ (numpy)")
    numpy = _refused("numpy()")
    tolist = _refused("tolist()")
    item = _refused("item()")
    untyped_storage = _refused("untyped_storage()")
    storage = _refused("storage()")
    _typed_storage = _refused("_typed_storage()")
    data_ptr = _refused("data_ptr()")
    __reduce_ex__ = _refused("pickling")
    __deepcopy__ = _refused("copy.deepcopy")

    @property
    def __cuda_array_interface__(self) -> NoReturn:
        raise self._refuse("__cuda_array_interface__")

    @classmethod
    def __torch_function__(
        cls,
        func: TorchOp,
        types: Collection[type],
        args: OpArgs = (),
        kwargs: OpKwargs | None = None,
    ) -> OpResult:  # torch's protocol: any op's result
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
    def _serve(
        cls, func: TorchOp, args: OpArgs, kwargs: OpKwargs
    ) -> OpResult:  # torch's protocol: any op's result
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

    def _query(
        self, func: TorchOp, name: str, args: OpArgs, kwargs: OpKwargs
    ) -> OpResult:  # an op's result: a size, a count, a flag, a string, a device...
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
    def __torch_dispatch__(
        cls,
        func: TorchOp,
        types: Collection[type],
        args: OpArgs = (),
        kwargs: OpKwargs | None = None,
    ) -> OpResult:
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
    def __torch_function__(
        cls,
        func: TorchOp,
        types: Collection[type],
        args: OpArgs = (),
        kwargs: OpKwargs | None = None,
    ) -> OpResult:  # torch's protocol: any op's result
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
    t: WholeTensor = tensor.as_subclass(WholeTensor)
    t._handed = handed
    return t


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
                f"{ranges_text(t._held)} of {tuple(t._full)}"
            )
        start, stop, _ = s.indices(t._full[dim])
        ranges[dim] = (start, max(0, stop - start))
    return _take(t, ranges, f"[{', '.join(f'{a}:{a + n}' for a, n in ranges.values())}]")


def _take(t: WindowTensor, ranges: Mapping[int, tuple[int, int]], asked: str) -> torch.Tensor:
    """The part ``ranges`` ({dim: (start, length)}) of ``t``: inside the window, its bytes (a plain
    tensor once every dimension is inside it, recorded as read; else a smaller window tensor);
    across the window's edge, a HandoffError."""
    window, held, full, origin = t._window, list(t._held), list(t._full), list(t._origin)
    for dim, (start, length) in ranges.items():
        lo, hi = held[dim]
        if start < lo or length < 0 or start + length > hi:
            raise HandoffError(
                f"{t._label}: the engine asked for {asked}; this rank holds "
                f"{ranges_text(t._held)} of {tuple(t._full)}: its sharding differs from the "
                "config's rule for this tensor (docs/engines.md)"
            )
        window = window.narrow(dim, start - lo, length)
        full[dim], held[dim] = length, (0, length)
        origin[dim] += start
    if all(b == (0, n) for b, n in zip(held, full, strict=False)):
        if t._handed is not None:
            t._handed.read(tuple((o, o + n) for o, n in zip(origin, full, strict=False)))
        return window
    return WindowTensor(window, full, held, t._label, handed=t._handed, origin=origin)
