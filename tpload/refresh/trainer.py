"""The trainer's side of a refresh: one :class:`RefreshSender` per trainer rank.

A round (:meth:`RefreshSender.send`):

1. each trainer rank takes the tensors it holds (``held_names()`` of vLLM's ``WeightSource``, or a
   plain mapping), and the ranks share what they hold, so each knows the whole table;
2. every rank plans each engine rank's windows with the loader's planner, under the engine's config
   and layout (sent by engine rank 0 at :meth:`~RefreshSender.connect`), and gives each weight and
   its scales to one trainer rank that holds them all;
3. each rank cuts each window it sends, per engine rank: its fingerprint (the loader's), and its
   sha256 at sha256 strength; a tensor served as stored (a plain tensor of the packed kind) has its
   window's fingerprint, and every other item is run through the loader's own loop over the
   trainer's tensors in memory (attest/predict.py's way) for the served tensors' fingerprints;
4. trainer rank 0 gathers those, makes each engine rank's digest (the same a fresh ``tpload.load``
   of a checkpoint of these weights gives it) and the version manifest, signs it when given a key,
   and sends it to every engine rank;
5. every rank sends each engine rank only its windows, in bounded chunks, to all engine ranks at
   once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from ..kernels.fingerprint import HostFingerprint, host_fingerprint
from ..loading.loop import run
from ..model.errors import LoadError
from ..model.progress import Silent
from ..model.pushed import TensorEntry, WindowEntry
from ..model.text import escape_name, first_line
from ..model.values import JsonObject, Triple
from ..planning.items import Item, Output
from ..selection.config import Config
from ..sources.hashing import Hasher
from ..sources.storage import StorageSource
from ..transfer.cpu import CpuTransfer
from ..verification.digest import digest
from ..verification.node import HashPlan
from .layout import EngineLayout
from .manifest import RankEntry, VersionManifest
from .rendezvous import (
    Hub,
    PeerLost,
    RefreshKey,
    Rendezvous,
    TransferGroup,
    join,
    key_of,
    open_rendezvous,
)
from .staged import chunks
from .tensors import DTYPES, Cutting, TensorStorage, config_for, entry_of, natural, owned_plan
from .terms import (
    CHUNK_BYTES,
    IN_FLIGHT,
    MAX_LAYOUT_BYTES,
    MAX_VERDICT_BYTES,
    TIMEOUT_S,
    RefreshCheck,
    RefreshError,
    RoundFigures,
    hash_threads,
    version_problem,
)

log = logging.getLogger("tpload.refresh")


class WeightSource(Protocol):
    """vLLM's ``WeightSource`` as the sender uses it: the names this rank holds (None: all), and
    ``(name, tensor)`` pairs, a tensor None for a name the rank does not hold."""

    def held_names(self) -> Iterable[str] | None: ...

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor | None]]: ...


def held_tensors(source: WeightSource | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors this trainer rank holds, by name (CPU or device: they are read to the host)."""
    if isinstance(source, Mapping):
        return {str(n): t for n, t in source.items()}
    names = source.held_names()
    wanted = None if names is None else set(names)
    out = {}
    for name, t in source:
        if t is not None and (wanted is None or name in wanted):
            out[name] = t
    if wanted is not None and set(out) != wanted:
        missing = sorted(wanted - set(out))[:5]
        raise RefreshError(
            f"the weight source says it holds {', '.join(map(escape_name, missing))} but yielded "
            "no tensor for them"
        )
    return out


class RefreshSender:
    """One trainer rank's sender (see the module doc). ``trainer_group``: the trainer's own process
    group (it carries rank 0's rendezvous to the other ranks; None: pass it to :meth:`connect`
    yourself). What the ranks share in a round crosses the transfer group, under its timeout.
    ``key``: the refresh key (a 0600 file the engine holds too; docs/refresh.md): the rendezvous
    is proven by it, and only its holders join. ``signer_key``: an EC private key (PEM) to sign
    each version manifest with.
    ``config``: the engine's config when its name cannot be read here (a TOML path on the engine's
    machine); its id must be the engine's."""

    def __init__(
        self,
        *,
        rank: int,
        trainer_ranks: int,
        trainer_group: dist.ProcessGroup | None = None,
        check: RefreshCheck = RefreshCheck.FINGERPRINT,
        key: RefreshKey | Path | str | None = None,
        signer_key: Path | str | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        timeout_s: float = TIMEOUT_S,
        config: Config | str | None = None,
    ) -> None:
        if not 0 <= rank < trainer_ranks:
            hint = ""
            if trainer_ranks == 1 and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
                hint = (
                    f" (WORLD_SIZE is {escape_name(os.environ['WORLD_SIZE'])}: call "
                    "torch.distributed.init_process_group() before making the sender, or pass "
                    "trainer_ranks)"
                )
            raise RefreshError(f"trainer rank {rank} is not in 0..{trainer_ranks - 1}{hint}")
        if chunk_bytes < 1:
            raise RefreshError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.rank, self.trainer_ranks, self.trainer_group = rank, trainer_ranks, trainer_group
        self.check = RefreshCheck(check)
        self.key = key_of(key)
        self.signer_key = signer_key
        self.chunk_bytes, self.timeout_s = chunk_bytes, timeout_s
        self.config_given = config
        self.group: TransferGroup | None = None
        self.layout: EngineLayout | None = None
        self.config: Config | None = None
        self._hub: Hub | None = None
        self._busy = threading.Lock()
        self._cutting: tuple[tuple[TensorEntry, ...], Cutting] | None = None

    # -- joining
    def rendezvous(self, *, engine_ranks: int, host: str = "127.0.0.1") -> Rendezvous:
        """Rank 0 opens the rendezvous (a store on a free port); every other trainer rank learns it
        through ``trainer_group`` (a collective: every trainer rank calls this)."""
        box: list[Any] = [None]
        if self.rank == 0:
            if self._hub is not None:
                self._hub.close()
            rv, self._hub = open_rendezvous(
                trainer_ranks=self.trainer_ranks,
                engine_ranks=engine_ranks,
                host=host,
                timeout_s=self.timeout_s,
                key=self.key,
            )
            box[0] = rv.to_json()
        if self.trainer_ranks > 1:
            if self.trainer_group is None:
                if self.rank == 0:  # the caller hands rank 0's rendezvous to the others
                    return Rendezvous.from_json(box[0])
                raise RefreshError(
                    "trainer ranks other than 0 learn the rendezvous through the trainer's group: "
                    "give trainer_group, or pass rank 0's Rendezvous to connect() yourself"
                )
            dist.broadcast_object_list(
                box, src=dist.get_global_rank(self.trainer_group, 0), group=self.trainer_group
            )
        return Rendezvous.from_json(box[0])

    def connect(self, rv: Rendezvous) -> EngineLayout:
        """Join the transfer group (blocks until every trainer and engine rank has) and receive the
        engine's layout from engine rank 0."""
        if rv.trainer_ranks != self.trainer_ranks:
            raise RefreshError(
                f"trainer rank {self.rank}: the rendezvous is for {rv.trainer_ranks} trainer "
                f"ranks, this sender has {self.trainer_ranks}"
            )
        with self._exclusive("connect()"):
            hub, self._hub = self._hub, None  # this rendezvous's: the old group's closed with it
            self.close()  # the old group (a broken one is left through a new rendezvous)
            self.group = join(rv, self.rank, key=self.key, hub=hub)
            raw = self.group.recv_bytes(
                rv.trainer_ranks, "the engine layout", limit=MAX_LAYOUT_BYTES
            )
            self.layout = EngineLayout.from_bytes(raw)
        self.config = config_for(self.layout, self.config_given)
        self._cutting = None
        return self.layout

    # -- a round
    def send(
        self, source: WeightSource | Mapping[str, torch.Tensor], *, version: int
    ) -> RoundFigures:
        """Send version ``version`` of the weights (see the module doc); every trainer rank calls
        it. Raises :class:`RefreshError` when the round failed: this side's problem (then every
        trainer rank raises it, and the engines refuse the round saying so), or the engines' verdict
        (the same line the engine ranks raise). A version is served whole or not at all."""
        with self._exclusive("send()"):
            group, layout = self._joined()
            started = time.perf_counter()
            try:
                return self._round(group, layout, source, version, started)
            except PeerLost as e:
                self.close()  # the engines waiting on this rank fail now, not at their timeout
                raise RefreshError(f"version {version}: {e}") from None
            except RefreshError:
                raise
            except BaseException:
                self.close()  # anything unforeseen: the engines see the group closed at once
                raise

    @contextlib.contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        """This sender's one call at a time: a second call while one runs is refused at once
        (two rounds interleaved on one group would garble both)."""
        if not self._busy.acquire(blocking=False):
            raise RefreshError(
                f"trainer rank {self.rank}: {what} was called while another call of this sender "
                "is running (one round at a time); refused, the running one goes on"
            )
        try:
            yield
        finally:
            self._busy.release()

    def _round(
        self,
        group: TransferGroup,
        layout: EngineLayout,
        source: WeightSource | Mapping[str, torch.Tensor],
        version: int,
        started: float,
    ) -> RoundFigures:
        problem, mine, held_here = "", {}, []
        bad_version = version_problem(version)
        group.tag = version if not bad_version else 0
        try:
            if bad_version:
                raise RefreshError(bad_version)
            mine = held_tensors(source)
            held_here = [list(astuple(entry_of(n, t))) for n, t in mine.items()]
        except Exception as e:  # noqa: BLE001 - any failure meets the peers' share, with its cause
            problem = _problem(self.rank, e)
        held = self._share({"held": held_here, "error": problem})
        problems = [h["error"] for h in held if h["error"]]
        part: JsonObject = {}
        windows: dict[int, list[np.ndarray]] = {}
        storage = None
        if not problems:
            try:
                cutting = self._cutting_of(_table([h["held"] for h in held]))
                owners = _owners(cutting, [{e[0] for e in h["held"]} for h in held])
                owned = frozenset(n for n, r in owners.items() if r == self.rank)
                storage = TensorStorage(cutting.catalogue, {n: mine[n] for n in owned})
                part, windows = self._cut(cutting, storage, owned)
            except Exception as e:  # noqa: BLE001 - as above: the peers fail in seconds with it
                problem = _problem(self.rank, e)
        try:
            parts = self._share({"part": part, "error": problem})
            problems = [p["error"] for p in parts if p["error"]]
            manifest = None
            if self.rank == 0:
                if problems:  # an empty manifest: the engines refuse the round with this line
                    body = b""
                    signature = f"the trainer aborted version {version}: {problems[0]}".encode()
                else:
                    manifest = self._manifest(version, cutting, [p["part"] for p in parts], owners)
                    body = manifest.to_bytes()
                    signature = manifest.sign(self.signer_key) if self.signer_key else b""
                for engine in range(layout.ranks):
                    what = f"version {version}'s manifest"
                    group.send_bytes(body, self._engine(engine), what)
                    group.send_bytes(signature, self._engine(engine), what)
            sent = self._send_windows(group, windows) if not problems else 0
            verdict = group.recv_bytes(
                self._engine(0),
                f"version {version}'s verdict",
                limit=MAX_VERDICT_BYTES,
                tag=group.tag,
            )
        finally:
            if storage is not None:
                storage.close()
        if problems and not verdict:
            raise RefreshError(f"version {version}: {problems[0]}")
        if verdict:  # the engines' line, escaped again here: it reaches this process's terminal
            raise RefreshError(escape_name(verdict.decode(errors="replace")))
        figures = RoundFigures(
            version,
            self.rank,
            sum(len(w) for w in windows.values()),
            sent,
            time.perf_counter() - started,
            self.check,
            tuple(r.digest for r in manifest.ranks) if manifest is not None else (),
        )
        log.info(
            "trainer rank %d: version %d sent: %d windows, %d bytes in %.3f s",
            self.rank, version, figures.windows, sent, figures.seconds,
        )  # fmt: skip
        return figures

    def close(self) -> None:
        """Leave the transfer group (the engines see the connection closed), and close a
        rendezvous opened and not yet joined."""
        if self._hub is not None:
            self._hub.close()
            self._hub = None
        if self.group is not None:
            self.group.close()
            self.group = None

    # -- the parts
    def _joined(self) -> tuple[TransferGroup, EngineLayout]:
        if self.group is None or self.layout is None:
            raise RefreshError(f"trainer rank {self.rank}: connect() first")
        if self.group.broken is not None:
            raise RefreshError(
                f"trainer rank {self.rank}: the transfer group is broken ({self.group.broken}); "
                "connect again through a new rendezvous"
            )
        return self.group, self.layout

    def _engine(self, e: int) -> int:
        return self.trainer_ranks + e

    def _cutting_of(self, table: tuple[TensorEntry, ...]) -> Cutting:
        if self._cutting is None or self._cutting[0] != table:
            assert self.layout is not None and self.config is not None  # noqa: S101 - _joined
            self._cutting = (table, Cutting(table, self.layout, self.config))
        return self._cutting[1]

    def _share(self, mine: JsonObject) -> list[JsonObject]:
        """Every trainer rank's ``mine`` (JSON-able), on every trainer rank, through rank 0 over
        the transfer group: every wait under its timeout, and a rank that failed still sends its
        error (its peers fail in seconds with the cause)."""
        if self.trainer_ranks == 1:
            return [mine]
        group, _ = self._joined()
        if self.rank != 0:
            group.send_bytes(json.dumps(mine).encode(), 0, "its part")
            every: list[JsonObject] = json.loads(group.recv_bytes(0, "every rank's part"))
            return every
        rest = range(1, self.trainer_ranks)
        every = [mine] + [json.loads(group.recv_bytes(t, "its part")) for t in rest]
        raw = json.dumps(every).encode()
        for t in rest:
            group.send_bytes(raw, t, "every rank's part")
        return every

    def _cut(
        self, cutting: Cutting, storage: TensorStorage, owned: frozenset[str]
    ) -> tuple[JsonObject, dict[int, list[np.ndarray]]]:
        """This rank's part of the manifest ({engine rank: {"served": lines, "windows": {name:
        [fingerprint, sha256]}}}) and its windows' bytes per engine rank, in send order."""
        part: JsonObject = {}
        windows: dict[int, list[np.ndarray]] = {}
        source = StorageSource(storage)
        for e in range(cutting.layout.ranks):
            full = cutting.plan(e)
            plain = frozenset(i.name for i in full.items if as_stored(i, full.kind))
            served: list[list[Any]] = []
            seen: dict[str, Triple] = {}
            looped = owned - plain
            if any(i.name in looped for i in full.items):  # a decode, a regrouped window
                result = run(
                    source,
                    owned_plan(full, looped),
                    transfer=CpuTransfer(torch.device("cpu")),
                    hasher=Hasher(HashPlan(e, frozenset())),
                    samples=0,
                    progress=Silent(),
                    ranks=cutting.catalogue.ranks(),
                )
                served += [_line(o, result.fingerprints[o.name]) for o in result.outputs]
                seen = {n: fp for n, (_, fp) in result.windows.items()}  # as the loop copied them
                del result
            cut: dict[str, list[Any]] = {}
            sends = []
            for name, view, box in cutting.windows(e):
                if name not in owned:
                    continue
                w, fp = _window(storage.window(name, view, box), seen.get(name))
                cut[name] = [list(fp), None]
                sends.append(w)
            if self.check == RefreshCheck.SHA256:  # hashlib lets go of the GIL: a few threads
                mine = [n for n, _, _ in cutting.windows(e) if n in owned]
                threads = max(1, hash_threads(self.trainer_ranks, "cuda"))  # no copy here
                with ThreadPoolExecutor(max_workers=threads) as pool:
                    for n, sha in zip(mine, pool.map(_sha256, sends), strict=True):
                        cut[n][1] = sha
            for item in full.items:  # served as stored: the served tensor is its window's bytes
                if item.name in owned and item.name in plain:
                    served += [_line(item.output(c.name), tuple(cut[c.name][0])) for c in item.cuts]
            part[str(e)] = {"served": served, "windows": cut}
            windows[e] = sends
        return part, windows

    def _manifest(
        self, version: int, cutting: Cutting, parts: list[JsonObject], owners: Mapping[str, int]
    ) -> VersionManifest:
        ranks = []
        order = cutting.catalogue.ranks()
        for e in range(cutting.layout.ranks):
            served = [
                (n, getattr(torch, d), tuple(s), (fp[0], fp[1], fp[2]))
                for p in parts
                for n, d, s, fp in p[str(e)]["served"]
            ]
            fps = {n: v for p in parts for n, v in p[str(e)]["windows"].items()}
            windows = tuple(
                WindowEntry(name, view, box, owners[name], tuple(fps[name][0]), fps[name][1])
                for name, view, box in cutting.windows(e)
            )
            ranks.append(RankEntry(digest(served, ranks=order), windows))
        assert self.layout is not None  # noqa: S101 - _joined
        return VersionManifest(
            version,
            self.layout,
            self.check,
            cutting.entries,
            tuple(ranks),
            self.trainer_ranks,
            self.chunk_bytes,
        )

    def _send_windows(self, group: TransferGroup, windows: dict[int, list[np.ndarray]]) -> int:
        """Every window of this rank to its engine rank, chunk by chunk, a few chunks in flight per
        engine rank (all engine ranks at once)."""
        streams = {
            e: (
                torch.from_numpy(w[a:b])
                for w in ws
                for a, b in chunks(w.size, self.chunk_bytes)
            )
            for e, ws in windows.items()
        }  # fmt: skip
        sent = 0
        flying: dict[int, deque[tuple[torch.Tensor, dist.Work]]] = {e: deque() for e in streams}
        while streams or any(flying.values()):
            for e in list(streams):
                while len(flying[e]) < IN_FLIGHT:
                    chunk = next(streams[e], None)
                    if chunk is None:
                        del streams[e]
                        break
                    if chunk.numel():
                        flying[e].append((chunk, group.isend(chunk, self._engine(e))))
                        sent += chunk.numel()
            for e, q in flying.items():
                if q:
                    group.wait(q.popleft()[1], self._engine(e), "the windows")
        return sent


def _problem(rank: int, e: BaseException) -> str:
    """A trainer rank's failure as its round's one line (a LoadError's own words; anything else
    named by its type)."""
    if isinstance(e, LoadError):
        return f"trainer rank {rank}: {first_line(e)}"
    return f"trainer rank {rank}: {type(e).__name__}: {first_line(e)}"


def _sha256(w: np.ndarray) -> str:
    return hashlib.sha256(w.data).hexdigest()


def _window(w: np.ndarray, fp: Triple | None) -> tuple[np.ndarray, Triple]:
    """A window's bytes as sent (flat, contiguous) and its fingerprint (``fp`` when the loop took
    it): rows whole, a view of the tensor; a column cut, copied and fingerprinted in one pass."""
    if w.flags.c_contiguous:
        return w.reshape(-1), fp or host_fingerprint(w)
    out = np.empty(w.shape, dtype=np.uint8)
    f = HostFingerprint(w.shape[1])
    f.add(w, 0, dst=out)
    return out.reshape(-1), fp or f.value()


def as_stored(item: Item, kind: str) -> bool:
    """Whether every tensor ``item`` serves is its window's bytes as stored, seen in the same rows
    (a plain tensor of the packed kind, not regrouped, not converted): then the served tensor's
    fingerprint is its window's, taken from the bytes sent, and the loop need not copy it."""
    if item.codec.checked or not item.codec.copies(item.fit, kind):
        return False
    for cut in item.cuts:
        out = item.output(cut.name)
        rows = out.shape[0] if len(out.shape) > 1 else 1
        if (
            cut.group != 1
            or DTYPES.get(out.dtype) != cut.dtype
            or out.nbytes != cut.nbytes
            or rows != cut.rows[1] - cut.rows[0]
        ):
            return False
    return True


def _line(out: Output, fp: Triple) -> list[Any]:
    """A served tensor's digest line, as JSON (verification/digest.py makes the line)."""
    return [out.name, str(out.dtype).removeprefix("torch."), list(out.shape), list(fp)]


def _table(held: list[list[Any]]) -> tuple[TensorEntry, ...]:  # [[name, dtype, shape]] a rank
    """The whole table from what each rank holds; a name two ranks hold differently is refused."""
    table: dict[str, TensorEntry] = {}
    for r, entries in enumerate(held):
        for name, dtype, shape in entries:
            e = TensorEntry(name, dtype, tuple(shape))
            if table.setdefault(name, e) != e:
                raise RefreshError(
                    f"tensor {escape_name(name)}: trainer ranks disagree on it "
                    f"({table[name].dtype} {list(table[name].shape)}; rank {r}: {dtype} {shape})"
                )
    return natural(table.values())


def _owners(cutting: Cutting, held: list[set[str]]) -> dict[str, int]:
    """Each stored name's sending trainer rank: a weight and its scales go to one rank holding them
    all, the least loaded so far (bytes), the lowest on a tie."""
    load = [0] * len(held)
    sizes = {m.name: m.nbytes for m in cutting.catalogue.tensors.values()}
    out: dict[str, int] = {}
    for names in cutting.groups():
        able = [r for r, h in enumerate(held) if all(n in h for n in names)]
        if not able:
            raise RefreshError(
                f"tensor {escape_name(names[0])}: no trainer rank holds it"
                + (f" with {', '.join(map(escape_name, names[1:]))}" if len(names) > 1 else "")
            )
        r = min(able, key=lambda r: (load[r], r))
        load[r] += sum(sizes[n] for n in names)
        out.update(dict.fromkeys(names, r))
    return out
