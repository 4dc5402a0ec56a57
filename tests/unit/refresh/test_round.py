"""One trainer rank and one engine rank (tp 1) in two threads of this process, over tpload's own
transfer links: the refusals a single engine rank makes before staging (the staging budget, an
unsigned manifest where a key is held, a weaker strength), a trainer that cannot make its round, a
manifest garbled on the wire, keys, versions, non-finite values, and a round staged over several
calls; after each failure the old version is kept and the next round (through a new rendezvous
where the group was lost) succeeds. Attacks by a member running modified code, misuse, junk
manifests and stalled or departed members are launched as processes, one family a launch
(tests/integration/test_refresh_attacks.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from tpload.planning import batches
from tpload.refresh.engine import RefreshReceiver
from tpload.refresh.layout import EngineLayout
from tpload.refresh.terms import RefreshCheck, RefreshError
from tpload.refresh.trainer import RefreshSender
from tpload.selection.config import load_config
from tpload.tools.published import write_published

from ...ckpt_tools import ec_keypair, whole


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    root = tmp_path_factory.mktemp("round")
    v1 = write_published(root / "v1", "llama-tiny", seed=5)
    v2 = write_published(root / "v2", "llama-tiny", seed=6)
    return whole(v1), whole(v2), v1


class Pair:
    """A sender and a receiver joined through a fresh rendezvous."""

    def __init__(self, root: Path, sender: RefreshSender, **kw: object) -> None:
        config = load_config("llama")
        model = json.loads((root / "config.json").read_text())
        layout = EngineLayout(config.id(), 1, 1, "packed", 1, config="llama", model=model)
        table = {n: (e.dtype, e.shape) for n, e in _entries(root).items()}
        self.sender = sender
        self.receiver = RefreshReceiver(
            rank=0, world=1, exchange_group=None, layout=layout, config=config,
            device=torch.device("cpu"), table=table, **kw,
        )  # fmt: skip
        self.connect()

    def connect(self) -> None:
        rv = self.sender.rendezvous(engine_ranks=1)
        t = threading.Thread(target=self.receiver.connect, args=(rv,))
        t.start()
        assert self.sender.connect(rv).tp == 1
        t.join()

    def round(
        self, source: object, version: int, calls: tuple[int | None, ...] = (None,)
    ) -> tuple[str, str]:
        """(the trainer's error or "", the engine's), the engine committing on success."""
        said: dict[str, str] = {}

        def send() -> None:
            try:
                self.sender.send(source, version=version)
                said["trainer"] = ""
            except RefreshError as e:
                said["trainer"] = str(e)

        t = threading.Thread(target=send)
        t.start()
        r = self.receiver
        r.start()
        try:
            for k, n in enumerate(calls):
                r.receive(final=k == len(calls) - 1, windows=n)
            self.state = {n: t.clone() for n, t in r.windows()}
            r.committed(version)
            said["engine"] = ""
        except RefreshError as e:
            said["engine"] = str(e)
        t.join(timeout=60)
        assert not t.is_alive(), "the trainer hung"
        return said["trainer"], said["engine"]

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()


def _entries(root: Path) -> dict:
    from tpload.refresh.tensors import entry_of

    return {n: entry_of(n, t) for n, t in whole(root).items()}


def _refused(pair: Pair, got: tuple[str, str], words: str, served: int) -> None:
    trainer, engine = got
    assert trainer == engine, got  # the trainer gets the engines' own line
    assert engine.startswith("refresh refused: engine rank 0") and words in engine, engine
    assert pair.receiver.served_version == served and pair.receiver.staged_bytes == 0
    assert pair.receiver.failed == engine


def test_a_round_over_the_staging_budget_is_refused_before_staging(weights) -> None:
    v1, v2, root = weights
    pair = Pair(root, RefreshSender(rank=0, trainer_ranks=1), staging_budget_bytes=1 << 10)
    try:
        _refused(pair, pair.round(v1, 1), "over the staging budget of 1,024 bytes", 0)
        pair.receiver.budget = 1 << 30
        assert pair.round(v1, 1) == ("", "")
        assert pair.receiver.served_version == 1
        figures = pair.receiver.figures
        assert figures is not None and figures.budget_bytes == 1 << 30
        assert figures.staged_bytes == sum(t.numel() * t.element_size() for t in v1.values())
        assert pair.state.keys() == v1.keys()
        assert all(torch.equal(pair.state[n], v1[n]) for n in v1)  # tp 1: every tensor whole
        assert pair.round(v2, 2, calls=(3, 5, None)) == ("", "")  # staged over three calls
        assert all(torch.equal(pair.state[n], v2[n]) for n in v2)
    finally:
        pair.close()


def test_an_engine_holding_a_key_takes_only_manifests_signed_by_it(weights, tmp_path) -> None:
    v1, _, root = weights
    key, pub = ec_keypair(tmp_path, "trainer")
    sender = RefreshSender(rank=0, trainer_ranks=1, check=RefreshCheck.SHA256)
    pair = Pair(root, sender, public_key=pub, check=RefreshCheck.SHA256)
    try:
        _refused(pair, pair.round(v1, 1), "the version manifest is not signed", 0)
        sender.check = RefreshCheck.FINGERPRINT
        sender.signer_key = key
        _refused(pair, pair.round(v1, 1), "the manifest's check is fingerprint; this engine", 0)
        sender.check = RefreshCheck.SHA256
        assert pair.round(v1, 1) == ("", "")
        assert pair.receiver.figures is not None
        assert pair.receiver.figures.check == RefreshCheck.SHA256
    finally:
        pair.close()


class Claims:
    """A weight source that says it holds a name it never yields."""

    def __init__(self, weights: dict) -> None:
        self.weights = weights

    def held_names(self) -> list[str]:
        return [*self.weights, "model.layers.9.mlp.up_proj.weight"]

    def __iter__(self):
        return iter(self.weights.items())


def test_a_trainer_that_cannot_make_its_round_aborts_it_on_every_side(weights) -> None:
    v1, _, root = weights
    pair = Pair(root, RefreshSender(rank=0, trainer_ranks=1))
    try:
        trainer, engine = pair.round(Claims(v1), 1)
        assert trainer == engine  # the engines' verdict reaches the trainer, with the cause
        assert "yielded no tensor for them" in engine
        assert engine.startswith("refresh refused: engine rank 0: the trainer aborted version 1")
        assert "model.layers.9.mlp.up_proj.weight" in engine
        assert pair.receiver.served_version == 0
        assert pair.round(v1, 1) == ("", "")  # the group stayed in step
    finally:
        pair.close()


class Truncated:
    """A manifest whose bytes lose their end on the wire."""

    def __init__(self, manifest) -> None:  # noqa: ANN001
        self.manifest, self.ranks = manifest, manifest.ranks

    def to_bytes(self) -> bytes:
        return self.manifest.to_bytes()[:-7]

    def sign(self, key) -> bytes:  # noqa: ANN001
        return b""


class Truncating(RefreshSender):
    truncate = False

    def _manifest(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        m = super()._manifest(*args, **kwargs)
        return Truncated(m) if self.truncate else m


def test_a_manifest_garbled_on_the_wire_is_refused_and_nobody_waits(weights) -> None:
    v1, _, root = weights
    pair = Pair(root, Truncating(rank=0, trainer_ranks=1, timeout_s=20.0))
    try:
        pair.sender.truncate = True
        trainer, engine = pair.round(v1, 1)
        assert engine.startswith("refresh refused: engine rank 0: the version manifest is"), engine
        assert "malformed" in engine
        assert trainer.startswith("version 1: trainer rank 0: engine rank 0 was lost"), trainer
        assert pair.receiver.served_version == 0
        pair.sender.truncate = False
        pair.connect()  # the group was dropped: a new rendezvous
        assert pair.round(v1, 1) == ("", "")
    finally:
        pair.close()


def _key(tmp_path: Path, name: str) -> Path:
    import os

    path = tmp_path / name
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


def test_a_refresh_key_joins_its_holders_and_an_unproven_init_leaves_the_live_group(
    weights, tmp_path
) -> None:
    v1, v2, root = weights
    key = _key(tmp_path, "refresh.key")
    pair = Pair(root, RefreshSender(rank=0, trainer_ranks=1, key=key), key=key)
    try:
        assert pair.round(v1, 1) == ("", "")
        live = pair.receiver.group
        for stranger_key in (None, _key(tmp_path, "other.key")):  # an init without the key
            stranger = RefreshSender(rank=0, trainer_ranks=1, key=stranger_key)
            rv = stranger.rendezvous(engine_ranks=1)
            with pytest.raises(
                RefreshError, match="refused before the live group|was not given|not proven"
            ):
                pair.receiver.connect(rv)
            stranger.close()
            assert pair.receiver.group is live and live.broken is None  # untouched
        assert pair.round(v2, 2) == ("", "")  # the live group still serves the next round
    finally:
        pair.close()


def test_versions_outside_1_to_2_63_are_refused_before_sending(weights) -> None:
    v1, _, root = weights
    pair = Pair(root, RefreshSender(rank=0, trainer_ranks=1))
    try:
        for bad in (0, -1, 2**63, 2**64, 10**30, True):
            trainer, engine = pair.round(v1, bad)
            assert "version must be an integer in 1..2**63-1" in trainer, trainer
            assert "the trainer aborted" in engine and trainer == engine, engine
        assert pair.round(v1, 2**63 - 1) == ("", "")
    finally:
        pair.close()


@pytest.mark.parametrize("batched", [True, False])
def test_non_finite_values_are_refused_unless_allowed(
    weights, batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the tiny model's tensors are all small: batched (one pass over many windows), or each
    # copied alone (the window's own pass), the flag raised by the pass that fingerprints them
    if not batched:
        monkeypatch.setattr(batches, "SMALL_BYTES", 0)
    v1, v2, root = weights
    name = "model.layers.0.mlp.up_proj.weight"
    bad = dict(v2)
    bad[name] = v2[name].clone()
    bad[name].view(-1)[5] = float("nan")
    bad[name].view(-1)[9] = float("inf")
    pair = Pair(root, RefreshSender(rank=0, trainer_ranks=1))
    try:
        assert pair.round(v1, 1) == ("", "")
        trainer, engine = pair.round(bad, 2)
        assert trainer == engine and f"tensor {name} (" in engine, engine
        assert "2 non-finite value(s) (NaN or inf; the first at element 5;" in engine, engine
        assert pair.receiver.served_version == 1
        small = dict(v2)  # a norm (1-D, at the start of a batch)
        small["model.norm.weight"] = v2["model.norm.weight"].clone()
        small["model.norm.weight"][3] = float("-inf")
        trainer, engine = pair.round(small, 2)
        assert trainer == engine and "tensor model.norm.weight (" in engine, engine
        assert "1 non-finite value(s) (NaN or inf; the first at element 3;" in engine, engine
        assert pair.receiver.served_version == 1
        pair.receiver.allow_nonfinite = True
        assert pair.round(bad, 2) == ("", "")
        assert torch.equal(pair.state[name].view(torch.int16), bad[name].view(torch.int16))
    finally:
        pair.close()


class Leaving(RefreshSender):
    """Leaves the group once its windows are sent: a trainer rank dead before the verdict."""

    def _send_windows(self, group, windows) -> int:  # noqa: ANN001
        super()._send_windows(group, windows)
        self.close()
        raise RefreshError("this trainer rank left before the verdict")


def test_a_trainer_rank_gone_before_the_verdict_leaves_the_others_their_verdict(weights) -> None:
    v1, _, root = weights
    config = load_config("llama")
    model = json.loads((root / "config.json").read_text())
    layout = EngineLayout(config.id(), 1, 1, "packed", 1, config="llama", model=model)
    table = {n: (e.dtype, e.shape) for n, e in _entries(root).items()}
    receiver = RefreshReceiver(
        rank=0, world=1, exchange_group=None, layout=layout, config=config,
        device=torch.device("cpu"), table=table,
    )  # fmt: skip
    first = Leaving(rank=0, trainer_ranks=2)
    second = RefreshSender(rank=1, trainer_ranks=2)
    rv = first.rendezvous(engine_ranks=1)
    joins = [
        threading.Thread(target=receiver.connect, args=(rv,)),
        threading.Thread(target=second.connect, args=(rv,)),
    ]
    for t in joins:
        t.start()
    first.connect(rv)
    for t in joins:
        t.join(30)
    said: dict[int, str] = {}

    def send(r: int, sender: RefreshSender) -> None:
        try:
            sender.send(v1, version=1)
            said[r] = ""
        except RefreshError as e:
            said[r] = str(e)

    threads = [threading.Thread(target=send, args=(r, s)) for r, s in ((0, first), (1, second))]
    for t in threads:
        t.start()
    receiver.start()
    receiver.receive(final=True)  # every window arrived: the engines' verdict passes
    for t in threads:
        t.join(30)
    try:
        assert receiver.version == 1
        assert said[1] == "", said  # the survivor heard the verdict: no "engine rank 0 was lost"
        assert "left before the verdict" in said[0]
    finally:
        second.close()
        receiver.close()


def test_a_round_is_the_loaders_sequence_with_the_gates_refresh_strategy(weights) -> None:
    """The check is the loader's (loading/sequence.py's HeldLoad) with the gate's strategy
    (verification/pushed.py): at sha256 strength its hash taps hash every window this rank reads,
    and its exchanged row carries the manifest it verified."""
    import hashlib

    from tpload.verification.pushed import Pushed

    v1, _, root = weights
    sender = RefreshSender(rank=0, trainer_ranks=1, check=RefreshCheck.SHA256)
    pair = Pair(root, sender, check=RefreshCheck.SHA256)
    try:
        t = threading.Thread(target=sender.send, args=(v1,), kwargs={"version": 1})
        t.start()
        r = pair.receiver
        r.start()
        r.receive(final=True)
        t.join(30)
        load = r._load
        assert load is not None and isinstance(load.gate, Pushed)
        assert r.manifest is not None
        sha = hashlib.sha256(r.manifest.to_bytes()).hexdigest()
        assert (load.fig.pushed_version, load.fig.pushed_sha256) == (1, sha)
        assert load.gate.anchor() == f"refresh version 1, manifest sha256 {sha}, check sha256"
        assert r._plan is not None and load.fig.hashed == len(r._plan.reads) > 0  # each hashed
        assert load.fig.digest == r.manifest.ranks[0].digest
        assert load.result is not None and r.version == 1
        r.committed(1)
    finally:
        pair.close()
