"""Every file tpload reads whole goes through the bounded reader of regular files
(storage/files.py: ``open_regular``, ``read_small``): a FIFO, a device or a huge file named by an
option, planted in the digest store or beside an attestation is refused by name at once, never
waited on or read into memory. docs/threat-model.md lists each such file and its limit; the audit
below keeps new code from reading a file another way."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import tpload
from tpload.cli import main
from tpload.model.errors import ConfigError, LoadError
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.storage.files import MAX_JSON_BYTES, read_small
from tpload.tools.export import export
from tpload.verification.store import DigestStore

PACKAGE = Path(tpload.__file__).parent

ALLOWED = {
    # package data shipped inside tpload (the shipped TOML configs), not a file a user names
    ("selection/config.py", "res.read_text()"),
    ("tools/families.py", "res.read_text()"),  # and the published families' (configs/presets/)
    # writes and the store's lock file: nothing is read from them
    # the hub-cache writer (synth --hub, tests) hashes the files it moves, streamed, never whole
    ("storage/hub.py", 'open(path, "rb")'),
    # the kernels compiled ahead: tpload's own source and the installed numba's, llvmlite's and
    # numpy's version files (hashed into the module's name), the CPU's description, and the module
    # and its stamp in the kernels' cache folder, each seen to be a regular file first (find())
    ("kernels/ahead.py", "(KERNELS / name).read_bytes()"),
    ("kernels/ahead.py", "(Path(spec.origin).parent / file).read_bytes()"),
    ("kernels/ahead.py", 'open("/proc/cpuinfo"'),
    ("kernels/ahead.py", "stamp_path.read_text()"),
    ("kernels/ahead.py", "path.read_bytes()"),
}
"""(module, the call's source) of every read or open that does not go through the bounded
reader, each for the reason said."""
WHOLE = {"read_text", "read_bytes"}
"""Methods that read a whole file (of a Path, a resource)."""
LOADERS = {"json", "tomllib", "np", "numpy", "pickle", "torch"}
"""Modules whose ``load``/``fromfile`` read a file (``json.loads`` of bytes read bounded: fine)."""


def _calls(tree: ast.AST, source: str) -> list[str]:
    """The source of each call that opens a file or reads one whole."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        module = (
            f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
        )
        if (
            (isinstance(f, ast.Name) and f.id == "open")
            or (isinstance(f, ast.Attribute) and f.attr in WHOLE)
            or (module in LOADERS and f.attr in ("load", "fromfile", "loadtxt"))
        ):
            out.append(ast.get_source_segment(source, node) or "")
    return out


def test_no_module_reads_a_file_around_the_bounded_reader() -> None:
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel, source = path.relative_to(PACKAGE).as_posix(), path.read_text()
        for call in _calls(ast.parse(source), source):
            if not any(rel == a and call.startswith(b) for a, b in ALLOWED):
                bare.append(f"{rel}: {call[:80]}")
    assert not bare, f"read these through storage/files.read_small or open_regular: {bare}"


def test_read_small_refuses_by_size_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_JSON_BYTES + 1)  # sparse: reading it would take a GiB
    with pytest.raises(LoadError) as e:
        read_small(big, "index")
    assert str(e.value) == (
        f"{big}: index is {MAX_JSON_BYTES + 1} bytes, more than any index needs (at most "
        f"{MAX_JSON_BYTES}); refused"
    )
    small = tmp_path / "small.pem"
    small.write_bytes(b"x" * 11)
    with pytest.raises(LoadError, match=r"small.pem: key is 11 bytes, .*\(at most 10\); refused"):
        read_small(small, "key", limit=10)


def test_a_config_toml_that_is_a_fifo_too_big_or_too_deep_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"c.toml: config is a FIFO; refused"):
        load_config(str(fifo))
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate((4 << 20) + 1)
    with pytest.raises(ConfigError, match=rf"big.toml: config is {(4 << 20) + 1} bytes"):
        load_config(str(big))
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match=r"deep.toml: config is not valid TOML \(nested too deep"):
        load_config(str(deep))


def test_a_fifo_in_the_digest_store_is_refused_by_name(small_ckpt: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert (
        main(["plan", str(small_ckpt), "--tp", "1", "--write", "--digest-store", str(store)]) == 0
    )
    (written,) = store.glob("*.json")
    written.unlink()
    os.mkfifo(written, 0o600)  # a stored prediction replaced by a FIFO: read whole, it would hang
    with pytest.raises(LoadError, match=r"stored digests are unreadable \(.*digest file is a FIFO"):
        DigestStore(store).read(written.stem)
    with pytest.raises(tpload.LoadError, match=r"digest file is a FIFO; refused"):
        tpload.load(small_ckpt, verify="digest", digest_store=str(store), progress=False)


def test_an_export_manifest_that_is_a_fifo_is_refused_by_verify(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "export"
    export(small_ckpt, out, Layout(1), load_config())
    manifest = out / "NATIVE_MANIFEST.json"
    manifest.unlink()
    os.mkfifo(manifest)
    assert main(["verify", str(out)]) == 1
    said = capsys.readouterr()
    assert f"{manifest}: export manifest is a FIFO; refused" in said.out + said.err
