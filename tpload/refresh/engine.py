"""The engine's side of a refresh: one :class:`RefreshReceiver` per engine rank (an engine
integration wraps it: tpload/integrations/ for vLLM).

A round: :meth:`~RefreshReceiver.start` clears the staging and touches no parameter;
:meth:`~RefreshReceiver.receive` takes the version manifest (its signature checked when the engine
holds a public key; its version newer than the one served; its layout, strength and table the
engine's; its windows the ones the loader's planner cuts for this rank) and stages this rank's
windows in host memory under a budget, each checked on receipt against the manifest's fingerprint.
The staging is a pre-partitioned rank file held in memory, and the loader's sequence runs over it
(loading/sequence.py's ``HeldLoad``) with the gate's refresh strategy (verification/pushed.py): the
handshake on the manifest's sha256, version and strength when the manifest is taken, the loop while
the windows land (its hash taps at sha256 strength, its fingerprints, this rank's digest against the
manifest's), and at the final call the loader's one exchange across the engine ranks, from which
every rank reaches the gate's verdict: on any failure every rank raises :class:`RefreshError` with
the same one line and keeps nothing; on success
:meth:`~RefreshReceiver.windows` hands the verified windows over and
:meth:`~RefreshReceiver.committed` moves the served version on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..kernels.fingerprint import HostFingerprint
from ..loading.loop import nonfinite_problem
from ..loading.result import LoadResult
from ..loading.sequence import Held, HeldLoad
from ..model.errors import LoadError
from ..model.modes import Kind, Verify
from ..model.pushed import PushedVersion, TensorEntry, WindowEntry
from ..model.text import escape_name, first_line
from ..options.load_options import LoadOptions
from ..planning.items import Item
from ..planning.planner import RankPlan
from ..selection.config import Config
from ..sources.storage import StorageSource
from ..verification import pushed
from .layout import EngineLayout
from .manifest import VersionManifest, signature_problem
from .rendezvous import Frame, PeerLost, RefreshKey, Rendezvous, TransferGroup, join, key_of
from .staged import Arrival, ArrivingStorage, StagedStorage, chunks
from .tensors import Cutting, natural
from .terms import (
    IN_FLIGHT,
    MAX_MANIFEST_BYTES,
    MAX_VERDICT_BYTES,
    TIMEOUT_S,
    RefreshCheck,
    RefreshError,
    RoundFigures,
    hash_threads,
)

log = logging.getLogger("tpload.refresh")

_ORDER = {RefreshCheck.FINGERPRINT: 0, RefreshCheck.SHA256: 1}


class RefreshReceiver:
    """One engine rank's receiver (see the module doc).

    ``exchange_group``: the engine ranks' CPU group the verdict is reached on (vLLM's TP CPU
    group; None for one engine rank). ``layout``: this engine's layout, sent to the trainer by
    engine rank 0. ``config``: the config it plans with. ``table``: the tensors the served model
    has (name -> (dtype, shape); ``tensors.table_of(root)`` reads a checkpoint's): a version whose
    table is not this one is refused (a missing tensor would otherwise serve uninitialised memory;
    a tensor the config skips may be left out); None: the first version received sets it.
    ``check``: the weakest strength accepted (the manifest names the round's). ``public_key``: an
    EC public key (PEM): every manifest must be signed by its private key. ``key``: the refresh
    key (a 0600 file the trainer holds too): a rendezvous not proven by it is refused before the
    live group is touched, and only its holders join. ``max_manifest_bytes``: the largest manifest
    accepted while no table is known (with one, what that table's manifest can need).
    ``allow_nonfinite``: take windows of floating tensors holding NaN or inf (refused by default:
    a trainer's diverged step would otherwise be served).
    ``staging_budget_bytes``: the most host bytes a round may stage on this rank (None: no
    bound); a round over it is refused before any window is staged. ``timeout_s``: every wait
    (the rendezvous's replaces it at connect)."""

    def __init__(
        self,
        *,
        rank: int,
        world: int,
        exchange_group: dist.ProcessGroup | None,
        layout: EngineLayout,
        config: Config,
        device: torch.device,
        staging_budget_bytes: int | None = None,
        served_version: int = 0,
        table: Mapping[str, tuple[str, tuple[int, ...]]] | None = None,
        check: RefreshCheck = RefreshCheck.FINGERPRINT,
        public_key: Path | str | None = None,
        key: RefreshKey | Path | str | None = None,
        max_manifest_bytes: int = MAX_MANIFEST_BYTES,
        allow_nonfinite: bool = False,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        if world != layout.ranks or not 0 <= rank < world:
            raise RefreshError(
                f"engine rank {rank} of {world}: the layout has {layout.ranks} engine ranks"
            )
        if config.id() != layout.config_id:
            raise RefreshError(
                f"engine rank {rank}: config {escape_name(config.name)} has id {config.id()}, the "
                f"layout says {layout.config_id}"
            )
        self.rank, self.world, self.exchange_group = rank, world, exchange_group
        self.layout, self.config, self.device = layout, config, device
        self.budget = staging_budget_bytes
        self.served_version = served_version
        self.table = (
            natural(TensorEntry(n, d, tuple(s)) for n, (d, s) in table.items())
            if table is not None
            else None
        )
        self.check, self.public_key, self.timeout_s = RefreshCheck(check), public_key, timeout_s
        self.key = key_of(key)
        self.max_manifest_bytes = max_manifest_bytes
        self.allow_nonfinite = allow_nonfinite
        self.group: TransferGroup | None = None
        self._no_group = "connect() was not called"
        self._busy = threading.Lock()
        self._receiving = False
        """A round's manifest was taken and its final call has not come: start() is refused."""
        self.figures: RoundFigures | None = None
        self.failed: str | None = None
        """The last round's one line when it failed (None: it passed, or none ran)."""
        self._cutting: tuple[tuple[TensorEntry, ...], Cutting] | None = None
        self._served_skips: frozenset[str] | None = None
        self._spare: np.ndarray | None = None
        self._opts = LoadOptions(verify=Verify.RANK, kind=Kind(layout.kind), config=config.name)
        """What every engine rank shares in the handshake beside the manifest (the terms)."""
        self._thread: threading.Thread | None = None
        """A round's loop, reading each window as it lands (None: no round runs)."""
        self._clear()

    @classmethod
    def for_checkpoint(
        cls,
        root: str | Path,
        *,
        rank: int,
        world: int,
        exchange_group: dist.ProcessGroup | None,
        device: torch.device | None = None,
        **options: Any,
    ) -> RefreshReceiver:
        """A receiver for an engine serving the checkpoint at ``root`` with tensor parallelism
        ``world``, planned as ``tpload.load`` plans it (packed kind): its config chosen from its
        ``config.json`` as ``--config auto`` does, its table read from its headers (a version must
        send exactly these tensors). ``options``: any other keyword of the constructor."""
        from ..loading.pick import choose, model_for
        from .tensors import table_of

        folder = Path(root)
        config, _ = choose("auto", folder)
        layout = EngineLayout(
            config.id(),
            world,
            1,
            "packed",
            world,
            config=config.name,
            model=model_for(folder, config),
        )
        return cls(
            rank=rank,
            world=world,
            exchange_group=exchange_group,
            layout=layout,
            config=config,
            device=device or torch.device("cpu"),
            table=options.pop("table", None) or table_of(folder),
            **options,
        )

    # -- state
    def _clear(self) -> None:
        if self._thread is not None:
            self._stop_check("the round was cleared")
        self.manifest: VersionManifest | None = None
        self.staging: np.ndarray | None = None
        self._storage: StagedStorage | None = None
        self._next = 0  # windows of this rank staged so far (in the manifest's order)
        self._problems: list[str] = []
        self._draining = False
        self._result: LoadResult | None = None
        self._plan: RankPlan | None = None
        self._verified = False
        self._started = time.perf_counter()
        self._arrival: Arrival | None = None
        self._load: HeldLoad | None = None
        """The loader's sequence over this round's staging (made when its handshake is met)."""
        self._thread = None
        self._manifest_sha = ""
        self._receiving = False
        self._opened = False
        """start() opened this round (cleared with the staging: a round's receives follow it)."""

    @contextlib.contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        """One call at a time: a call made while another runs (another thread) is refused at once,
        and the running one goes on."""
        if not self._busy.acquire(blocking=False):
            raise RefreshError(
                f"engine rank {self.rank}: {what} was called while another call of this receiver "
                "is running; refused, the running one goes on"
            )
        try:
            yield
        finally:
            self._busy.release()

    def _stop_check(self, why: str) -> None:
        """End a check still waiting for windows (a refused or failed round)."""
        if self._arrival is not None:
            self._arrival.abort(why)
        if self._thread is not None:
            self._thread.join(self.timeout_s)

    @property
    def staged_bytes(self) -> int:
        return 0 if self.staging is None else int(self.staging.size)

    def _who(self) -> str:
        v = f" version {self.manifest.version}" if self.manifest is not None else ""
        return f"engine rank {self.rank}{v}".replace(" version", ", version")

    # -- joining
    def connect(self, rv: Rendezvous) -> None:
        """Join the transfer group (blocks until every trainer and engine rank has); engine rank 0
        sends the layout to every trainer rank. Any earlier group and staging is dropped (a new
        trainer after a dead one starts clean)."""
        with self._exclusive("connect()"):
            self._connect(rv)

    def _connect(self, rv: Rendezvous) -> None:
        if rv.engine_ranks != self.world:
            raise RefreshError(
                f"engine rank {self.rank}: the rendezvous is for {rv.engine_ranks} engine ranks, "
                f"this engine has {self.world}"
            )
        # proven first: a rendezvous the key does not vouch for never touches the live group
        rv.secret(self.key, who=f"engine rank {self.rank}")
        try:
            group = join(rv, rv.trainer_ranks + self.rank, key=self.key)
        except RefreshError as e:
            self._no_group = f"connect() failed: {first_line(e)}"
            raise
        self.close()
        self.timeout_s = rv.timeout_s
        self.group = group
        if self.rank == 0:
            raw = self.layout.to_bytes()
            for t in range(rv.trainer_ranks):
                self.group.send_bytes(raw, t, "the engine layout")

    def start(self) -> None:
        """A new round: the staging cleared. No parameter is touched. Refused while a round is
        being received (its final call has not come): that round goes on."""
        with self._exclusive("start()"):
            group_up = self.group is not None and self.group.broken is None
            if self._receiving and group_up and self.manifest is not None:
                raise RefreshError(
                    f"engine rank {self.rank}: start() was called while version "
                    f"{self.manifest.version} is being received; refused (finish it with "
                    "receive(final=True) first)"
                )
            self._clear()
            self._opened = True

    # -- receiving
    def receive(self, *, final: bool, windows: int | None = None) -> None:
        """Stage and check this call's windows: the next ``windows`` of this rank's (None: all
        that remain). The first call of a round takes the manifest first. The ``final`` call
        reaches the verdict on every engine rank; any failure raises :class:`RefreshError` there,
        the same line on every rank, leaving the staging cleared and the served version
        unchanged. A non-final call never raises for what it received (its problems wait for the
        verdict), so every rank reaches the final call's exchange."""
        with self._exclusive("receive()"):
            self._receive(final=final, windows=windows)

    def _receive(self, *, final: bool, windows: int | None) -> None:
        if self._verified:
            raise RefreshError(
                f"engine rank {self.rank}: receive() was called after version {self.version} was "
                "verified; hand it over and call committed(), or start() a new round"
            )
        if not self._opened:  # a round's receives follow its start(): nothing is waited for
            raise RefreshError(
                f"engine rank {self.rank}: receive() was called before start() (after "
                f"version {self.served_version} was served, or a round was refused); refused "
                "(start_weight_update first)"
            )
        try:
            if self.group is None or self.group.broken is not None:
                why = self.group.broken if self.group is not None else self._no_group
                raise PeerLost(f"{self._who()}: no transfer group ({why})")
            if self.manifest is None and not self._problems:
                self._take_manifest(self.group)
            if self._load is None:  # the round's first call: the handshake, once the manifest is in
                self._begin()
            if self.manifest is not None:
                self._stage(self.group, windows)
        except PeerLost as e:
            mine = f"engine rank {self.rank}: "
            text = str(e)
            self._problems.append(
                f"{self._who()}: {text.removeprefix(mine)}" if text.startswith(mine) else text
            )
            self._stop_check(str(e))
            if self.group is not None:
                self.group.close()  # the trainer ranks waiting on this rank fail now
        except LoadError as e:  # any refusal becomes this round's problem
            self._problems.append(f"{self._who()}: {first_line(e)}")
        except Exception as e:  # noqa: BLE001 - never raised on one rank alone: the others wait
            self._problems.append(f"{self._who()}: {type(e).__name__}: {first_line(e)}")
            self._stop_check(str(e))
            if self.group is not None:
                self.group.close()  # where the streams stand is unknown: nobody waits on them
        if self._load is None:  # failed before the handshake: every engine rank meets it a round
            self._begin()
        if final:
            self._receiving = False
            self._verdict()

    def _begin(self) -> None:
        """The loader's sequence over this round's staging, up to its handshake (the manifest's
        sha256, version and strength: every engine rank must verify the same one), met once a
        round on every engine rank, whatever failed before (then with this rank's first problem);
        once it passes, its loop starts on a thread, reading each window as it lands. A round the
        handshake refuses is drained: its windows are received and dropped."""
        m = self.manifest
        self._load = HeldLoad(
            self.rank,
            self.world,
            self.exchange_group,
            who=self._who(),
            timeout_s=self.timeout_s,
            judge=pushed.judge,
        )
        held = None
        staged, plan, staging, arrival = self._storage, self._plan, self.staging, self._arrival
        if (
            m is not None
            and staged is not None
            and plan is not None
            and staging is not None
            and arrival is not None
            and not self._problems
        ):  # staged without a problem: the loader's loop checks it as it lands
            facts = PushedVersion(
                m.version,
                self._manifest_sha,
                str(m.check),
                m.ranks[self.rank].digest,
                m.ranks[self.rank].windows,
            )
            storage = ArrivingStorage(staged, staging, arrival)
            held = Held(
                self._opts,
                storage,
                StorageSource(storage),
                plan,
                self.config,
                lambda job: pushed.Pushed(job, facts),
                pushed.no_stamp,
                hash_threads=hash_threads(self.world, self.device.type),
                finite=not self.allow_nonfinite,
            )
        ok = self._load.begin(
            held,
            failed=self._problems[0] if self._problems else "",
            pushed=(self._manifest_sha, m.version) if m is not None else ("", 0),
        )
        if not ok:
            self._draining = True
            return
        self._thread = threading.Thread(
            target=self._load.run, name=f"tpload-refresh-check-{self.rank}", daemon=True
        )
        self._thread.start()

    def _manifest_limit(self) -> int:
        """The most bytes a manifest for this engine can need: from the served table when there is
        one (its names, each with a window per engine rank, generously), else the bound given."""
        if self.table is None:
            return self.max_manifest_bytes
        names = sum(len(json.dumps(t.name)) + 48 + 24 * len(t.shape) for t in self.table)
        return 1 << 16 | (names * (1 + 4 * self.world) + 320 * 4 * self.world * len(self.table))

    def _take_manifest(self, group: TransferGroup) -> None:
        self._receiving = True
        body, tag = group.recv_tagged(0, "the version manifest", limit=self._manifest_limit())
        signature = group.recv_bytes(
            0, "the manifest's signature", limit=MAX_VERDICT_BYTES, tag=tag
        )
        group.tag = tag  # every chunk of this round carries the version
        if not body:  # the trainer could not make the round: its line says why
            said = escape_name(signature.decode(errors="replace"))[:1000]
            if self.public_key is not None:  # an unsigned word is shown as such, never trusted
                said = f"the version manifest is not signed (the trainer sent instead: {said})"
            self._problems.append(f"{self._who()}: {said}")
            return
        unsigned = ""
        if self.public_key is not None:  # checked over the raw bytes before any parse
            unsigned = signature_problem(body, signature or None, self.public_key)
            if unsigned and signature:  # signed by another key, or changed: nothing of it is
                raise PeerLost(f"{self._who()}: {unsigned}")  # parsed, the group is dropped
        try:
            manifest = VersionManifest.from_bytes(body)
        except RefreshError as e:  # no sizes to drain by: the trainers must not wait on this rank
            raise PeerLost(f"{self._who()}: {first_line(e)}") from None
        if manifest.version != tag:
            raise PeerLost(
                f"{self._who()}: the manifest says version {manifest.version}, its frame "
                f"{tag} (replayed from another round)"
            )
        if manifest.trainer_ranks != group.rv.trainer_ranks:
            raise PeerLost(
                f"{self._who()}: the manifest names {manifest.trainer_ranks} trainer ranks, the "
                f"transfer group has {group.rv.trainer_ranks}"
            )
        if manifest.layout.ranks != self.world:
            raise PeerLost(
                f"{self._who()}: the manifest is for {manifest.layout.ranks} engine ranks, this "
                f"engine has {self.world}"
            )
        self.manifest = manifest
        self._manifest_sha = hashlib.sha256(body).hexdigest()
        # an unsigned manifest from a member of the group (it proved the group's secret: a
        # trainer not given its signing key) is parsed, bounded by the limit above, only to drain
        # its windows so no trainer waits
        problems = [unsigned] if unsigned else self._refusals(manifest)
        if problems:  # refused before any window is staged: its windows are received and dropped
            self._problems += [f"{self._who()}: {p}" for p in problems]
            self._draining = True
            return
        mine = manifest.ranks[self.rank].windows
        cutting = self._cutting_of(manifest.tensors)
        self._storage = StagedStorage(cutting.catalogue, mine)
        try:
            self.staging = self._buffer(self._storage.nbytes)
        except MemoryError:
            self._problems.append(
                f"{self._who()}: its {self._storage.nbytes:,} bytes of windows could not be staged "
                "(out of host memory; staging_budget_bytes refuses such a round up front)"
            )
            self._storage, self._draining = None, True
            return
        self._plan = cutting.plan(self.rank)
        self._arrival = Arrival(self._storage, self.timeout_s)

    def _buffer(self, nbytes: int) -> np.ndarray:
        """The staging's host buffer: the last round's when it is the same size (a fresh one costs
        a page fault a page, as much as the transfer on a busy host). Its old bytes are never
        read: every read waits for its windows to arrive in this round."""
        if self._spare is None or self._spare.size != nbytes:
            self._spare = None  # the old one goes before the new one is made
            self._spare = np.empty(nbytes, dtype=np.uint8)
        return self._spare

    def _refusals(self, m: VersionManifest) -> list[str]:
        """Why this manifest cannot be served here (checked before any window is staged)."""
        if m.version <= self.served_version:
            return [
                f"version {m.version} is not newer than the served version "
                f"{self.served_version} (a repeated or older version is refused)"
            ]
        if m.layout != self.layout:
            return [f"the manifest was planned for {m.layout}, this engine is {self.layout}"]
        if _ORDER[m.check] < _ORDER[self.check]:
            return [
                f"the manifest's check is {m.check}; this engine takes {self.check} or stronger"
            ]
        problems = pushed.table_problems(self.table, m.tensors, self._skipped())
        if problems:
            return problems
        try:
            cutting = self._cutting_of(m.tensors)
            planned = cutting.windows(self.rank)
        except LoadError as e:
            return [f"the version's tensors cannot be planned: {first_line(e)}"]
        sent = [(w.name, w.view, w.box) for w in m.ranks[self.rank].windows]
        if sent != planned:
            return [_window_difference(planned, sent)]
        nbytes = m.ranks[self.rank].nbytes
        if self.budget is not None and nbytes > self.budget:
            return [
                f"its windows for this rank are {nbytes:,} bytes, over the staging budget of "
                f"{self.budget:,} bytes"
            ]
        return []

    def _skipped(self) -> frozenset[str]:
        """The served table's tensors the config skips: a version need not carry them."""
        if self.table is None:
            return frozenset()
        if self._served_skips is None:
            try:
                skipped = Cutting(self.table, self.layout, self.config).planner.skipped
            except LoadError:
                skipped = []
            self._served_skips = frozenset(skipped)
        return self._served_skips

    def _cutting_of(self, table: tuple[TensorEntry, ...]) -> Cutting:
        if self._cutting is None or self._cutting[0] != table:
            self._cutting = (table, Cutting(table, self.layout, self.config))
        return self._cutting[1]

    def _stage(self, group: TransferGroup, count: int | None) -> None:
        """Receive the next windows from every trainer stream at once (one receive posted per
        stream), each checked on receipt; a round that is refused is drained, not staged."""
        assert self.manifest is not None  # noqa: S101 - receive() calls it after the manifest
        mine = self.manifest.ranks[self.rank].windows
        end = len(mine) if count is None else min(len(mine), self._next + count)
        todo = mine[self._next : end]
        chunk = self.manifest.chunk_bytes
        staging = torch.from_numpy(self.staging) if self.staging is not None else None
        offsets = self._storage.offsets if self._storage is not None else {}
        streams: dict[int, list[tuple[WindowEntry, int, int]]] = {}
        for w in todo:
            for a, b in chunks(w.nbytes, chunk):
                streams.setdefault(w.trainer, []).append((w, a, b))
        heads = {t: 0 for t in streams}
        flying: dict[int, deque[tuple[dist.Work | None, WindowEntry, int]]] = {
            t: deque() for t in streams
        }

        def post(t: int) -> None:  # up to IN_FLIGHT receives per stream (matched in order)
            while heads[t] < len(streams[t]) and len(flying[t]) < IN_FLIGHT:
                w, a, b = streams[t][heads[t]]
                heads[t] += 1
                if b == a:
                    if not flying[t]:
                        self._arrived(w, b)  # an empty window: nothing to receive
                        continue
                    flying[t].append((None, w, b))  # in its place among the chunks
                    continue
                if staging is not None and not self._draining:
                    at = offsets[w.name]
                    into = staging[at + a : at + b]
                else:  # drained: each chunk its own scratch (several are in flight)
                    into = torch.empty(b - a, dtype=torch.uint8)
                flying[t].append((group.irecv(into, t, tag=group.tag), w, b))

        for t in streams:
            post(t)
        while any(flying.values()):
            for t, q in flying.items():
                if not q:
                    continue
                work, w, b = q.popleft()
                if work is not None:
                    group.wait(work, t, f"window {escape_name(w.name)}")
                self._arrived(w, b)
                post(t)
        self._next = end

    def _arrived(self, w: WindowEntry, upto: int) -> None:
        """A chunk of ``w`` ending at byte ``upto`` arrived: the window's check once it is whole."""
        if upto != w.nbytes or self._draining or self._storage is None or self.staging is None:
            return
        if self._plan is not None and w.name in self._plan.reads:
            if self._arrival is not None:
                self._arrival.done(w.name)  # the loop fingerprints it as it copies it
            return
        at = self._storage.offsets[w.name]  # a deferred tensor: no loop reads it
        dtype = self._storage.catalogue.get(w.name).dtype
        window = self.staging[at : at + w.nbytes].reshape(w.rows, w.row_bytes)
        fp = HostFingerprint(w.row_bytes, finite="" if self.allow_nonfinite else dtype)
        fp.add(window, 0)
        problem = pushed.window_problem(w, fp.value())  # the gate's rule, on the evidence here
        if problem:
            self._problems.append(f"{self._who()}: {problem}")
        if fp.nonfinite:  # the loop's wording, for the loop's rule
            count, what = nonfinite_problem(window, dtype)
            self._problems.append(
                f"{self._who()}: tensor {escape_name(w.name)} (from trainer rank {w.trainer}): "
                f"{count} {what} in this rank's window"
            )

    # -- the verdict
    def _verdict(self) -> None:
        """The loader's exchange across the engine ranks and the gate's verdict of it
        (verification/pushed.py's judge), one line the same on every rank; engine rank 0 sends
        it to the trainers."""
        problem = self._problems[0] if self._problems else self._unfinished()
        if problem:
            self._stop_check(problem)
        if len(self._problems) > 1:
            problem += f" (and {len(self._problems) - 1} more problem(s) on this rank)"
        if self._load is None:  # a bug: _receive meets the handshake on every path
            self._begin()
        assert self._load is not None  # noqa: S101 - _begin made it
        try:
            verdict = self._load.end(problem)
            line = "" if verdict.passed else verdict.problems[0]
        except LoadError as e:  # a rank lost mid-vote: each survivor names it, in the same form
            line = pushed.lost(self._who(), e)
        self._result = self._load.result
        self._tell_trainers(line)
        if line:
            self.failed = line
            self._clear()
            self.figures = None
            raise RefreshError(line)
        self.failed = None
        self._verified = True
        assert self.manifest is not None  # noqa: S101 - no problem means a manifest was taken
        self.figures = RoundFigures(
            self.manifest.version,
            self.rank,
            len(self.manifest.ranks[self.rank].windows),
            self.staged_bytes,
            time.perf_counter() - self._started,
            self.manifest.check,
            (self.manifest.ranks[self.rank].digest,),
            self.staged_bytes,
            self.budget,
        )

    def _tell_trainers(self, line: str) -> None:
        """Engine rank 0 sends the verdict to every trainer rank ("" when it passed), so the
        trainer's ``send`` returns or raises with the engines' own line."""
        group = self.group
        if self.rank != 0 or group is None or group.broken is not None:
            return  # a lost trainer: the others lost this rank too (its group is closed)
        raw = line.encode()[:MAX_VERDICT_BYTES]
        # every live trainer rank hears it, even when another one is gone: each link's send is
        # waited for on its own, and only then is a lost one's group closed
        posted = [
            (t, group.links[t].post(Frame.CONTROL, memoryview(raw), group.tag))
            for t in range(group.rv.trainer_ranks)
        ]
        lost = []
        for t, work in posted:
            try:
                if not work.wait(group.timeout):
                    lost.append(t)
            except Exception:  # noqa: BLE001 - a closed link: that trainer rank is gone
                lost.append(t)
        if lost:
            group.broken = f"{group.name(lost[0])} was lost before the verdict reached it"
            group.close()

    def _unfinished(self) -> str:
        """Why this rank's loop cannot give its verdict yet: the round ended before its manifest
        or some of its windows arrived, or the loop is still running past the timeout."""
        m = self.manifest
        if m is None or self._storage is None or self.staging is None:
            return f"{self._who()}: the round ended before the version manifest arrived"
        mine = m.ranks[self.rank].windows
        if self._next != len(mine):
            missing = [w.name for w in mine[self._next :]]
            return (
                f"{self._who()}: the round ended with {len(missing)} window(s) not received: "
                f"{', '.join(map(escape_name, missing[:5]))}"
            )
        if self._thread is not None:
            self._thread.join(self.timeout_s)
            if self._thread.is_alive():
                return f"{self._who()}: the check did not finish within {self.timeout_s:g} s"
        return ""

    # -- the hand-over
    @property
    def version(self) -> int | None:
        """The version verified and not yet committed (None: none)."""
        return self.manifest.version if self._verified and self.manifest is not None else None

    @property
    def items(self) -> tuple[Item, ...]:
        """The verified plan's items (for integrations/handoff.py's Handoff: what each window is a
        part of)."""
        return self._verified_plan().items

    def state(self) -> dict[str, torch.Tensor]:
        """{stored name: this rank's verified window} (host tensors; the served tensors of the
        loader's arena, and each deferred tensor whole from the staging)."""
        plan = self._verified_plan()
        assert self._result is not None and self._storage is not None and self.staging is not None  # noqa: S101
        out = dict(self._result.tensors)
        for name in plan.deferred:
            meta = self._storage.catalogue.get(name)
            at, w = self._storage.offsets[name], self._storage.windows[name]
            raw = torch.from_numpy(self.staging[at : at + w.nbytes].copy())  # the staging is reused
            out[name] = raw.view(_torch_dtype(meta.dtype)).reshape(meta.shape)
        return out

    def windows(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The verified windows, (stored name, window tensor) in natural order: what an engine's
        loaders get (wrapped as WindowTensors by integrations/handoff.py's Handoff(state(), items,
        rank=))."""
        state = self.state()
        for name in natural(TensorEntry(n, "", ()) for n in state):
            yield name.name, state[name.name]

    def _verified_plan(self) -> RankPlan:
        if not self._verified or self._plan is None:
            raise RefreshError(f"engine rank {self.rank}: no verified version to hand over")
        return self._plan

    def committed(self, version: int) -> None:
        """The engine now serves ``version`` (the verified one): the served version moves on and the
        staging is let go."""
        if self.version != version:
            raise RefreshError(
                f"engine rank {self.rank}: version {version} was not the one verified "
                f"({self.version})"
            )
        assert self.manifest is not None  # noqa: S101
        self.served_version = version
        if self.table is None:
            self.table = self.manifest.tensors
        figures = self.figures
        self._clear()
        self.figures = figures

    def close(self) -> None:
        """Leave the transfer group and drop any staging."""
        if self.group is not None:
            self.group.close()
            self.group = None
        self._clear()
        self._spare = None


def _torch_dtype(stored: str) -> torch.dtype:
    from .tensors import DTYPES

    return next(d for d, s in DTYPES.items() if s == stored)


def _window_difference(planned: list[Any], sent: list[Any]) -> str:
    want = {n: (v, b) for n, v, b in planned}
    got = {n: (v, b) for n, v, b in sent}
    for n in want:
        if n not in got:
            return (
                f"tensor {escape_name(n)}: this rank's plan has a window of it, the manifest none"
            )
        if want[n] != got[n]:
            return (
                f"tensor {escape_name(n)}: the manifest's window {list(got[n][1])} of view "
                f"{list(got[n][0])} is not this rank's planned {list(want[n][1])} of "
                f"{list(want[n][0])}"
            )
    for n in got:
        if n not in want:
            return f"tensor {escape_name(n)}: the manifest sends a window this rank's plan has not"
    return "the manifest's windows are not in this rank's planned order"
