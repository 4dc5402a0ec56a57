"""Window tensors without an engine: they serve exactly their window and refuse every other access
(one test per access: DLPack, numpy, storages, data_ptr, torch functions with a window in their
arguments, C code); whole tensors serve every op; both record what the loader read."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from tpload.integrations.handed import Handed, HandoffError
from tpload.integrations.window_tensor import WholeTensor, WindowTensor


def window_tensor() -> tuple[torch.Tensor, WindowTensor]:
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    return full, WindowTensor(full[4:8].clone(), (8, 6), ((4, 8), (0, 6)), "w (rank 1)")


def tracked() -> tuple[torch.Tensor, WindowTensor, Handed]:
    """A window of rows 4:8 of an 8x6 tensor whose reads are recorded."""
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    handed = Handed("w", ((4, 8), (0, 6)), whole=False)
    handed.taken = True
    return (
        full,
        WindowTensor(full[4:8].clone(), (8, 6), handed.held, "w (rank 1)", handed=handed),
        handed,
    )


def test_a_window_tensor_shows_the_whole_shape_and_serves_its_window() -> None:
    full, w = window_tensor()
    assert tuple(w.shape) == (8, 6) and w.size(0) == 8 and w.dim() == 2 and w.dtype == torch.float32
    assert w.numel() == 48 and w.device.type == "cpu"
    got = w.narrow(0, 4, 4)
    assert type(got) is torch.Tensor and torch.equal(got, full[4:8])
    assert torch.equal(torch.narrow(w, 0, 5, 2), full[5:7])  # inside the window: a part of it
    part = w.narrow(1, 2, 3)  # a whole dimension narrowed first: still a window tensor of the rest
    assert isinstance(part, WindowTensor) and tuple(part.shape) == (8, 3)
    assert torch.equal(part.narrow(0, 4, 4), full[4:8, 2:5])
    assert torch.equal(w[4:8], full[4:8]) and torch.equal(w[4:6, 1:3], full[4:6, 1:3])
    assert torch.equal(w[4:8, ...], full[4:8]) and torch.equal(w[..., 4:6, :], full[4:6])
    assert "holds [4:8, 0:6]" in repr(w)


@pytest.mark.parametrize(
    "attempt",
    [
        lambda w: w.narrow(0, 0, 4),  # another rank's rows
        lambda w: w.narrow(0, 3, 2),  # across the window's edge
        lambda w: w[0:8],
        lambda w: w + 1,
        lambda w: torch.zeros(8, 6).copy_(w),  # the whole tensor copied
        lambda w: w.t(),
        lambda w: w[2],
        lambda w: w[..., 0:2],  # Ellipsis first: all rows
        lambda w: w[None],
    ],
)
def test_a_window_tensor_refuses_bytes_it_does_not_hold(attempt) -> None:  # noqa: ANN001
    _, w = window_tensor()
    with pytest.raises(HandoffError, match=r"^w \(rank 1\): the engine"):
        attempt(w)


# Every way to a window's memory or to an op on all of it, and the access the message must name.
ACCESSES = {
    "torch.utils.dlpack.to_dlpack": (lambda w: torch.utils.dlpack.to_dlpack(w), "from C code"),
    "__dlpack__": (lambda w: w.__dlpack__(), "__dlpack__"),
    "__dlpack_device__": (lambda w: w.__dlpack_device__(), "__dlpack_device__"),
    "np.from_dlpack": (lambda w: np.from_dlpack(w), "__dlpack"),
    "torch.from_dlpack": (lambda w: torch.from_dlpack(w), "__dlpack"),
    "np.asarray": (lambda w: np.asarray(w), "__array__"),
    "__array__": (lambda w: w.__array__(), "__array__"),
    "numpy": (lambda w: w.numpy(), "numpy()"),
    "untyped_storage": (lambda w: w.untyped_storage(), "untyped_storage()"),
    "storage": (lambda w: w.storage(), "storage()"),
    "data_ptr": (lambda w: w.data_ptr(), "data_ptr()"),
    "tolist": (lambda w: w.tolist(), "tolist()"),
    "item": (lambda w: w.item(), "item()"),
    "torch.cat": (lambda w: torch.cat([w, torch.zeros(8, 6)]), "torch.cat"),
    "torch.cat(tensors=)": (lambda w: torch.cat(tensors=[torch.zeros(8, 6), w]), "torch.cat"),
    "torch.stack": (lambda w: torch.stack([torch.zeros(8, 6), w]), "torch.stack"),
    "torch.add": (lambda w: torch.add(torch.zeros(8, 6), w), "torch.add"),
    "x + w": (lambda w: torch.zeros(8, 6) + w, "Tensor.add"),
    "torch.tensor": (lambda w: torch.tensor(w), "from C code"),
    ".data": (lambda w: w.data, "attribute .data"),
    ".T": (lambda w: w.T, "attribute .T"),
    "__cuda_array_interface__": (lambda w: w.__cuda_array_interface__, "__cuda_array_interface__"),
    "pickle": (lambda w: pickle.dumps(w), "pickling"),
    "deepcopy": (lambda w: copy.deepcopy(w), "copy.deepcopy"),
    "Parameter": (lambda w: torch.nn.Parameter(w), "Tensor.detach"),
    "contiguous": (lambda w: w.contiguous(), "Tensor.contiguous"),
    "to": (lambda w: w.to(torch.float64), "Tensor.to"),
    "view": (lambda w: w.view(-1), "Tensor.view"),
    "iteration": (lambda w: list(w), "Tensor."),
    "bool": (lambda w: bool(w), "Tensor.__bool__"),
}


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")
@pytest.mark.parametrize("access", list(ACCESSES))
def test_every_access_outside_the_allow_list_is_refused_naming_tensor_rank_and_access(
    access: str,
) -> None:
    attempt, named = ACCESSES[access]
    _, w, handed = tracked()
    with pytest.raises(HandoffError) as e:
        attempt(w)
    assert str(e.value).startswith("w (rank 1): the engine's weight loader used ") and named in str(
        e.value
    )
    assert "holds only [4:8, 0:6] of (8, 6)" in str(e.value)
    assert not handed.reads  # nothing was served


def test_a_window_in_torch_cat_under_map_raises_instead_of_ending_the_iteration_silently() -> None:
    """torch.cat([w, x]) once raised a bare StopIteration, which list(map(...)) takes for the
    end."""
    _, w, _ = tracked()
    weights = [("a", w), ("b", w)]
    calls = []

    def loader(item: tuple[str, torch.Tensor]) -> torch.Tensor:
        calls.append(item[0])
        return torch.cat([item[1], torch.zeros(8, 6)])

    with pytest.raises(HandoffError, match=r"^w \(rank 1\): .*used torch\.cat"):
        list(map(loader, weights))
    assert calls == ["a"]


def test_metadata_is_served_as_the_whole_tensors_and_is_never_a_read() -> None:
    _, w, handed = tracked()
    assert (
        w.shape == (8, 6)
        and w.size() == (8, 6)
        and w.size(1) == 6
        and w.size(-1) == 6
        and len(w) == 8
    )
    assert (
        w.dim() == 2 and w.ndim == 2 and w.numel() == 48 and w.nelement() == 48 and w.nbytes == 192
    )
    assert (
        w.dtype == torch.float32
        and w.device.type == "cpu"
        and w.element_size() == 4
        and w.itemsize == 4
    )
    assert (
        w.stride() == (6, 1) and w.is_contiguous() and w.is_floating_point() and not w.requires_grad
    )
    assert f"{w}" == repr(w) == "WindowTensor(w (rank 1), shape (8, 6), holds [4:8, 0:6])"
    assert hash(w) == hash(w)
    assert not handed.reads and not handed.consumed


def test_reads_are_recorded_and_a_window_is_consumed_once_they_cover_it() -> None:
    full, w, handed = tracked()
    assert torch.equal(w.narrow(0, 4, 2), full[4:6])
    assert (
        not handed.consumed
        and handed.what() == "only [4:6, 0:6] read of the [4:8, 0:6] this rank holds"
    )
    assert torch.equal(w[6:8], full[6:8])  # the other half (as fused gate/up loaders read a window)
    assert handed.consumed
    _, w, handed = tracked()
    cols = w.narrow(1, 0, 3)  # a whole dimension first: nothing read yet, a window of the rest
    assert isinstance(cols, WindowTensor) and not handed.reads
    cols.narrow(0, 4, 4)
    assert handed.reads == {((4, 8), (0, 3))} and not handed.consumed
    w.narrow(1, 3, 3).narrow(0, 4, 4)
    assert handed.consumed
    _, w, handed = tracked()
    w[4:8, 1:3]  # slicing both dimensions at once reads only the part asked
    assert handed.reads == {((4, 8), (1, 3))} and not handed.consumed


def tracked_whole(t: torch.Tensor, handed: Handed) -> WholeTensor:
    from tpload.integrations.window_tensor import whole_tensor

    handed.taken = True
    return whole_tensor(t, handed)


def test_a_whole_tensor_serves_every_op_and_counts_any_but_metadata_as_a_read() -> None:
    for read in (
        lambda t, p: p.copy_(t),
        lambda t, p: p.fill_(t[0].item()),
        lambda t, p: p.__setitem__(0, t[0]),
        lambda t, p: t.to(torch.float64),
        lambda t, p: t.data,
    ):
        handed = Handed("norm", ((0, 4),), whole=True)
        t = tracked_whole(torch.arange(4.0), handed)
        t.shape, t.dtype, t.size(0), t.numel(), t.dim(), repr(t)  # noqa: B018 (metadata: no read)
        assert not handed.reads
        param = torch.zeros(4)
        out = read(t, param)
        assert handed.consumed
        assert type(out) in (
            torch.Tensor,
            type(None),
        )  # results are plain: tracking does not spread
    handed = Handed("norm", ((0, 4),), whole=True)
    handed.taken = True
    assert handed.what() == "taken, never read"
