"""Checks and records that need no GPU and no world: predicted digests, verification at rest,
manifests.

* ``tpload plan DIR --digest`` runs every rank's plan through the load's own
  code (:func:`tpload.loading.loop.run`) on the CPU, one rank at a time, so the digests
  it prints are exactly what a load on any device must produce; ``--write``
  first checks every tensor the layout uses by sha256 against the manifest,
  then keeps the digests in the operator's digest store (verification/store.py)
  stamped with what they were verified against.
* ``tpload verify DIR`` checks a checkpoint at rest and lists every bad tensor.
* ``tpload manifest DIR`` hashes every tensor and writes NATIVE_MANIFEST.json; ``--hash blake3``
  then checks every tensor against it by sha256 and keeps a blake3 of each in the operator's
  digest store (verification/blake3sums.py).

A signed folder (a model.sig: verification/signing.py) is checked against its signature by both,
as a load checks it: the caller verifies the bundle first (``signing.precheck``, with the load's
signer options) and hands the :class:`~tpload.verification.signing.SignedModel` in; neither
vouches for bytes the signature does not.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any  # JSON rows and figures

from ..attest.predict import predict
from ..loading.planner import planner_of
from ..model.errors import CheckpointError, LoadError
from ..model.progress import Meter
from ..model.text import escape_name
from ..model.values import MANIFEST_NAME, Layout
from ..selection.config import Config
from ..sources.hashing import at_rest as gate_at_rest
from ..sources.hashing import hash_whole, spare_cores
from ..sources.whole_files import FileHasher
from ..storage.base import Storage
from ..storage.files import atomic_write, folder_of, read_json
from ..storage.pins import Pins, pins_doc
from ..storage.sharded import ShardedStorage
from ..verification.hashes import Digests, file_problems, mismatches
from ..verification.hashes import require as require_blake3
from ..verification.signing import SignedModel
from ..verification.store import DigestStore, checkpoint_stamp, stale, write_sidecar
from ..verification.strategy import layout_key


def record_verified(
    root: str | os.PathLike[str],
    config: Config,
    layout: Layout,
    kind: str,
    *,
    store: str | os.PathLike[str] | None = None,
    progress: Meter | None = None,
) -> tuple[list[str], Path]:
    """``tpload plan --write``: hash every tensor the layout uses, then store every rank's digest,
    stamped with what was verified (raises LoadError listing every mismatch; nothing is written
    then).

    One opening serves all: the store key (the manifest's sha256), the stamp and every rank's digest
    come from the same catalogue and file handles, and at the end the stamp, the open shards, the
    manifest's bytes and the JSON files it pins are checked again: if any moved while the digests
    were computed, nothing is stored. A store inside the checkpoint is refused first."""
    digest_store = DigestStore(store, checkpoint=root)
    storage = ShardedStorage(Path(root).absolute())
    try:
        cat = storage.catalogue
        if cat.manifest_sha256 is None:
            raise CheckpointError(
                f"{escape_name(storage.root)}: no {MANIFEST_NAME}: trusted digests are verified "
                "against it; write one with "
                f"`python -m tpload manifest {escape_name(storage.root)}`"
            )
        stamp = checkpoint_stamp(storage)
        manifest_sha = cat.manifest_sha256
        windows: list[dict[str, Any]] = []
        digests = predict(
            root,
            config,
            layout,
            kind,
            verify=True,
            storage=storage,
            windows=windows,
            progress=progress,
        )
        moved = [
            f"{what} changed while the digests were computed"
            for what in stale(stamp, checkpoint_stamp(storage))
        ]
        moved += storage.changed()
        now = Pins.of(storage.root).manifest_sha256
        if now != manifest_sha:
            moved.insert(
                0,
                "the manifest changed while the digests were computed "
                f"(sha256 {manifest_sha[:16]}... "
                f"then, {(now or 'none')[:16]}... now)",
            )
        if not moved:
            try:
                cat.check_plan_files()
            except LoadError as e:
                moved.append(str(e))
        if moved:
            raise CheckpointError(
                f"nothing stored: {escape_name(storage.root)} moved under `plan --write` (run it "
                "again once nothing writes the checkpoint):\n  - " + "\n  - ".join(moved)
            )
    finally:
        storage.close()
    key = layout_key(config.id(), layout, kind)
    # the per-tensor predictions first: a store whose digests are written always has its windows
    digest_store.write_windows(manifest_sha, key, digests, windows)
    path = digest_store.write(manifest_sha, Path(root).absolute(), key, digests, stamp)
    return digests, path


# -- at rest -------------------------------------------------------------------------------------


def verify_checkpoint(
    root: str | os.PathLike[str],
    config: Config | None,
    *,
    threads: int = 2,
    signed: SignedModel | None = None,
    progress: Meter | None = None,
) -> list[str]:
    """Every problem with the checkpoint at rest: headers, index, manifest, every sha256, and (with
    a config) scale bytes, NaN codes and decodes that would overflow bf16. An export is checked rank
    file by rank file against its own manifest. ``signed``: the folder's verified model.sig, the
    anchor then, as in a load (its signed manifest's per-tensor digests, or every file whole against
    its signed digest). ``progress``: the command's meter."""
    from ..storage.partitioned import is_partitioned

    path = Path(root).absolute()
    if path.is_dir() and is_partitioned(path):
        return _verify_export(path, threads, progress)
    try:
        storage = ShardedStorage(path)
    except LoadError as e:
        return [str(e)]
    try:
        cat = storage.catalogue
        cat.refuse_headers_only("verifying it")
        if signed is not None and not signed.manifest_sha256:  # every file whole: the anchor
            problems = _signed_problems(storage, signed)
            checkers = _value_checkers(storage, config, problems) if config is not None else {}
            names = [n for n in cat.names() if n in checkers]
            return problems + (_scan(storage, names, checkers, threads, compare=False))
        if signed is not None:  # its signed manifest, the one checked against its signed bytes
            problems = _signed_problems(storage, signed)
            if problems:
                return problems
        if (
            signed is None and storage.file_digests is not None
        ):  # a hub snapshot or local-dir download without a manifest: whole files
            problems = _file_problems(storage, progress=progress)
            names, compare = cat.names(), False
        else:
            problems = storage.manifest_problems(cat.names())
            if (
                cat.manifest is None
            ):  # a local-dir download with unvouched files: its vouched ones still checked
                return problems + (
                    _file_problems(storage, storage.local.digests, progress)
                    if storage.local
                    else []
                )
            problems += Pins.of(
                storage.root
            ).problems()  # config.json, hf_quant_config.json, the index against their pins
            names, compare = [n for n in cat.names() if n in cat.manifest], True
        checkers = _value_checkers(storage, config, problems) if config is not None else {}
        if compare or checkers:
            problems += _scan(
                storage,
                names if compare else [n for n in names if n in checkers],
                checkers,
                threads,
                compare=compare,
                progress=progress,
            )
        return problems
    finally:
        storage.close()


def _value_checkers(storage: Storage, config: Config, problems: list[str]) -> dict[str, Any]:
    """{tensor name: (its item, its item's checker, the check its blocks feed, its place in the
    item's order)} for every tensor the config classifies: an item's cuts in order, scales before
    the weight, as a load feeds them (``Item.value_feed``)."""
    try:
        planner = planner_of(storage.catalogue, config)
    except LoadError as e:
        problems.append(f"config {config.name} does not fit: {e}")
        return {}
    plan = planner.plan(Layout(1), "packed", 0)
    out = {}
    for item in plan.items:
        checker = item.codec.checker(item.fit, item.weight, item.scale)
        for k, cut in enumerate(item.cuts):
            out[cut.name] = (item, checker, item.value_feed(checker, cut), k)
    return out


def _signed_problems(
    storage: ShardedStorage, signed: SignedModel, *, whole: bool = False
) -> list[str]:
    """What a verified model.sig says of the folder's files: every file read must be signed; a
    signed manifest must be the one whose signed bytes were checked; without one (or ``whole``),
    every file hashed whole against the digest the bundle signs for it (the load's
    whole_files.SignedFiles, run here in the foreground)."""
    paths = storage.paths()
    try:
        signed.check_covered(paths)
        if signed.manifest_sha256 and not whole:
            signed.check_manifest(storage.catalogue.manifest_sha256)
            return []
    except LoadError as e:
        return [str(e)]
    expected = signed.expected(paths)
    results = FileHasher(storage, sorted(expected), {}, {}).expect(expected).start().finish()
    return file_problems(results, expected)


def _file_problems(
    storage: ShardedStorage,
    digests: Mapping[Path, str] | None = None,
    progress: Meter | None = None,
) -> list[str]:
    """Each shard of a hub snapshot or a local-dir download whose sha256 is not the one its blob is
    named by or its etag records (the load's own whole-file hasher and verdict, run here in the
    foreground)."""
    digests = storage.file_digests if digests is None else digests
    if digests is None:  # (asked only for a folder vouched for file by file)
        raise ValueError("no file digests to check (a bug in tpload)")
    files = sorted(digests)
    sink = (
        progress(sum(_size(f) for f in files), len(files), unit="file")
        if progress is not None
        else None
    )
    try:
        results = FileHasher(storage, files, {}, {}, progress=sink).start().finish()
    finally:
        if sink is not None:
            sink.close()
    source = storage.file_source
    return file_problems(results, digests, named_by=source.named_by if source else None)


def _size(path: Path) -> int:
    """A file's size for the progress's total (0 if it cannot be read: the hasher says why)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _scan(
    storage: Storage,
    names: list[str],
    checkers: dict[str, Any],
    threads: int,
    *,
    compare: bool = True,
    progress: Meter | None = None,
    what: str = "",
) -> list[str]:
    """Read every named tensor once: sha256 against the manifest (``compare``), and the value checks
    on the way (a scale before its weight, as the checkers need)."""
    order = sorted(
        names, key=lambda n: (checkers[n][0].name, checkers[n][3]) if n in checkers else (n, 0)
    )
    feeds = {n: feed for n, (_, _, feed, _) in checkers.items()}
    hashed = hash_whole(
        storage,
        order,
        threads=max(0, min(threads, spare_cores(1))),
        feeds=feeds,
        progress=progress,
        what=what,
    )
    problems = mismatches(hashed) if compare else []
    seen = set()
    for item, checker, _, _ in checkers.values():
        if item.name in seen:
            continue
        seen.add(item.name)
        for count, what, about in checker.problems():
            if count:
                problems.append(
                    f"{escape_name(storage.stored(about).path)}: tensor {escape_name(about)}: "
                    f"{count} {what}"
                )
    return problems


def _verify_export(root: Path, threads: int, progress: Meter | None) -> list[str]:
    """An export at rest: each rank file's header against its manifest list, and every window's
    sha256."""
    from ..storage.partitioned import PartitionedStorage

    try:
        doc: Any = read_json(root / MANIFEST_NAME, "export manifest")  # its shape checked here
        meta = doc["partitioned"]
        tp, ep = int(meta["tp"]), int(meta["ep"])
    except LoadError as e:
        return [str(e)]
    except (ValueError, KeyError, TypeError) as e:
        return [
            f"{escape_name(root / MANIFEST_NAME)}: not a readable export manifest "
            f"({escape_name(e)})"
        ]
    problems = []
    for rank in range(tp * ep):
        try:
            storage = PartitionedStorage(root, tp=tp, ep=ep, rank=rank, world=tp * ep)
        except LoadError as e:
            problems.append(str(e))
            continue
        try:
            problems += _scan(
                storage,
                sorted(storage.windows),
                {},
                threads,
                progress=progress,
                what=f"rank file {rank + 1} of {tp * ep}",
            )
        finally:
            storage.close()
    return problems


def write_manifest(
    root: str | os.PathLike[str],
    *,
    force: bool = False,
    threads: int = 2,
    signed: SignedModel | None = None,
    progress: Meter | None = None,
) -> Path:
    """Hash every tensor and write NATIVE_MANIFEST.json (refusing to overwrite unless ``force``);
    written beside and renamed, so a reader never sees half a manifest. ``root``: a folder, or a
    ``.gguf`` file (the manifest goes into its folder, and vouches for that file or split set
    alone). ``signed``: the folder's verified model.sig; every file is first checked whole against
    its signed digest, so a manifest is never written over bytes the signature does not vouch for.
    ``progress``: the command's meter."""
    path = folder_of(Path(root).absolute()) / MANIFEST_NAME
    if os.path.lexists(path) and not force:
        raise CheckpointError(f"{escape_name(path)} exists; pass --force to overwrite it")
    storage = ShardedStorage(
        Path(root).absolute(), manifest=False
    )  # the old one may be what is being replaced
    catalogue = storage.catalogue
    names = catalogue.names()
    try:
        catalogue.refuse_headers_only("a manifest of it")
        # a hub snapshot or a local-dir download: vouch only for files that match their blob names
        # or etags (a local-dir file without fresh metadata, modified or copied since its
        # download, is vouched for as it is now, as in any plain folder)
        digests = (
            storage.local.fresh_digests() if storage.local is not None else storage.file_digests
        )
        if signed is not None:
            bad = _signed_problems(storage, signed, whole=True)
            if bad:
                raise CheckpointError(
                    f"no manifest written: {len(bad)} problem(s) against {signed.what}:\n  - "
                    + "\n  - ".join(bad)
                )
        elif digests:
            bad = _file_problems(storage, digests, progress)
            if bad:
                raise CheckpointError(
                    f"no manifest written: {len(bad)} file(s) do not match their "
                    f"{storage.file_source.names if storage.file_source else 'digests'}:\n  - "
                    + "\n  - ".join(bad)
                )
        hashed = hash_whole(
            storage, names, threads=max(0, min(threads, spare_cores(1))), progress=progress
        )
    finally:
        storage.close()
    tensors = {
        n: {
            "file": catalogue.tensors[n].file,
            "dtype": catalogue.tensors[n].dtype,
            "shape": list(catalogue.tensors[n].shape),
            "sha256": hashed[n].sha256,
        }
        for n in names
    }
    # the JSON files that shape a plan, pinned (storage/pins.py); the index as it was read for the
    # table, a GGUF set's key-values as its headers were read
    pins = pins_doc(
        path.parent,
        known=catalogue.files_read,
        gguf_kv={f: sha for f, (sha, _) in catalogue.gguf_kv.items()},
    )
    atomic_write(path, json.dumps({"format": 1, **pins, "tensors": tensors}, indent=1) + "\n")
    return path


def write_blake3(
    root: str | os.PathLike[str],
    *,
    threads: int = 2,
    store: str | os.PathLike[str] | None = None,
    progress: Meter | None = None,
    signed: SignedModel | None = None,
) -> Path:
    """``tpload manifest DIR --hash blake3``: read every tensor the manifest lists once, checking
    its sha256 against the manifest and taking its blake3 from the same bytes; only if every one
    matches, keep the blake3 digests in the operator's store, stamped with what was checked (the
    stamp is taken before the first read, so a shard written since makes them stale). Raises
    LoadError listing every problem; nothing is written then. The checkpoint folder is not touched
    (a store inside it is refused first). ``signed``: the folder's verified model.sig: its manifest
    must be the signed one, or, unsigned, every file is first checked whole against its signed
    digest.
    """
    require_blake3()
    path = Path(root).absolute()
    digest_store = DigestStore(store, checkpoint=path)
    storage = ShardedStorage(path)
    try:
        cat = storage.catalogue
        cat.refuse_headers_only("blake3 digests of it")
        if cat.manifest is None or cat.manifest_sha256 is None:
            raise CheckpointError(
                f"{escape_name(path)}: no {MANIFEST_NAME}: blake3 digests are checked against it; "
                f"write one with `python -m tpload manifest {escape_name(path)} --hash blake3`"
            )
        stamp = checkpoint_stamp(storage)
        names = [n for n in cat.names() if n in cat.manifest]
        problems = cat.manifest_problems(
            cat.names()
        )  # a tensor the manifest omits: no sidecar for a partial one
        if signed is not None:
            problems += _signed_problems(storage, signed)
        if problems:
            raise CheckpointError(
                f"no blake3 digests written: {len(problems)} problem(s) against the manifest:\n  - "
                + "\n  - ".join(problems)
            )
        checked = gate_at_rest(
            storage,
            names,
            threads=max(0, min(threads, spare_cores(1))),
            digests=Digests(threads=max(1, spare_cores(1)), also=("blake3",)),
            what="no blake3 digests written",
            progress=progress,
        )
        return write_sidecar(digest_store, cat.manifest_sha256, path, checked, stamp)
    finally:
        storage.close()
