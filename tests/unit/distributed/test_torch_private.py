"""Each private torch API tpload uses, by its own path and by its fallback (a stand-in object that
lacks the attribute)."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import tpload
from tpload.distributed import torch_private as tp


@pytest.fixture
def world() -> Iterator[dist.ProcessGroup]:
    """A one-rank gloo world, destroyed after the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_default_store_is_the_worlds(world: dist.ProcessGroup) -> None:
    store = tp.default_store()
    assert store is not None
    store.set("k", "v")
    assert store.get("k") == b"v"


def test_default_store_without_a_world_is_none() -> None:
    assert not dist.is_initialized()
    assert tp.default_store() is None


def test_default_store_falls_back_to_none_without_the_function() -> None:
    assert tp.default_store(SimpleNamespace()) is None


def test_a_gloo_group_has_a_cpu_backend(world: dist.ProcessGroup) -> None:
    assert tp.has_cpu_backend(world)


def test_a_group_without_a_cpu_backend_is_told_apart() -> None:
    def no_cpu(device: torch.device) -> None:
        raise RuntimeError(f"no backend for {device}")

    assert not tp.has_cpu_backend(SimpleNamespace(_get_backend=no_cpu))


def test_cpu_backend_falls_back_to_the_public_backend_config(
    world: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in = SimpleNamespace()  # no _get_backend
    monkeypatch.setattr(dist, "get_backend_config", lambda g: "cpu:gloo,cuda:nccl")
    assert tp.has_cpu_backend(stand_in)
    monkeypatch.setattr(dist, "get_backend_config", lambda g: "cuda:nccl")
    assert not tp.has_cpu_backend(stand_in)


def test_empty_host_cache_runs_torchs() -> None:
    calls: list[int] = []
    assert tp.empty_host_cache(SimpleNamespace(_host_emptyCache=lambda: calls.append(1)))
    assert calls == [1]
    assert tp.empty_host_cache() == hasattr(torch._C, "_host_emptyCache")  # the real one runs


def test_empty_host_cache_falls_back_to_nothing() -> None:
    assert tp.empty_host_cache(SimpleNamespace()) is False


class _Traced(torch.Tensor):
    seen = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        cls.seen += 1
        with tp.torch_function_off():
            return func(*args, **(kwargs or {}))


def test_torch_function_off_lets_a_subclass_run_torchs_op() -> None:
    t = torch.ones(3).as_subclass(_Traced)
    _Traced.seen = 0
    out = t + 1
    assert _Traced.seen == 1 and type(out) is torch.Tensor  # once, not recursively; a plain result


def test_torch_function_off_falls_back_to_disable_torch_function() -> None:
    stand_in = SimpleNamespace(DisableTorchFunction=torch._C.DisableTorchFunction)
    with tp.torch_function_off(stand_in):
        pass


def test_torch_function_off_without_either_names_what_is_missing() -> None:
    with pytest.raises(RuntimeError, match="neither DisableTorchFunctionSubclass"):
        tp.torch_function_off(SimpleNamespace())


def test_tree_leaves_by_torch_and_by_the_fallback() -> None:
    tree = (1, [2, {"a": 3, "b": (4,)}], 5)
    assert tp.tree_leaves(tree) == [1, 2, 3, 4, 5]
    assert tp.tree_leaves(tree, SimpleNamespace()) == [1, 2, 3, 4, 5]


def test_no_private_torch_name_outside_this_module() -> None:
    root = os.path.dirname(tpload.__file__)  # the whole package, not only distributed/
    private = re.compile(r"torch\._(?!_)|_c10d|\._get_backend|utils\._pytree")  # not __version__
    found = []
    for folder, _, files in os.walk(root):
        if os.sep + "tools" in folder:
            continue  # the tools are not the library
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path == tp.__file__:
                continue
            with open(path) as f:
                text = f.read()
            found += [f"{path}: {m.group()}" for m in private.finditer(text)]
    assert not found, found
