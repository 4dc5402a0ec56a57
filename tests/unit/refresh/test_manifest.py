"""The version manifest: one statement, one encoding; a signature in the attestation's key format
that a changed field, another key or no signature fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpload.refresh.layout import EngineLayout
from tpload.refresh.manifest import RankEntry, TensorEntry, VersionManifest, WindowEntry
from tpload.refresh.terms import RefreshCheck, RefreshError

from ...ckpt_tools import ec_keypair

LAYOUT = EngineLayout("abc123", 2, 1, "packed", 2, config="llama", model={"num_heads": 4})


def manifest(version: int = 3, check: RefreshCheck = RefreshCheck.SHA256) -> VersionManifest:
    tensors = (TensorEntry("w.2", "BF16", (4, 8)), TensorEntry("w.10", "F32", (8,)))
    ranks = tuple(
        RankEntry(
            f"{r}" * 64,
            (
                WindowEntry("w.2", (4, 16), ((2 * r, 2 * r + 2), (0, 16)), r, (1, -2, 3), "a" * 64),
                WindowEntry("w.10", (1, 32), ((0, 1), (0, 32)), 0, (4, 5, -6), "b" * 64),
            ),
        )
        for r in range(2)
    )
    return VersionManifest(version, LAYOUT, check, tensors, ranks, 2, 1 << 20)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("keys")
    key, pub = ec_keypair(root, "trainer")
    _, other = ec_keypair(root, "other")
    return key, pub, other


def test_the_bytes_are_canonical_and_read_back_to_the_same_manifest() -> None:
    m = manifest()
    raw = m.to_bytes()
    assert VersionManifest.from_bytes(raw) == m
    assert raw == manifest().to_bytes()  # the same statement, the same bytes
    doc = json.loads(raw)
    assert doc["version"] == 3 and doc["check"] == "sha256" and doc["layout"]["tp"] == 2
    assert raw != manifest(version=4).to_bytes()
    spaced = json.dumps(doc, sort_keys=True).encode()  # the same statement, other bytes
    with pytest.raises(RefreshError, match="not its canonical encoding"):
        VersionManifest.from_bytes(spaced)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d.update(version=-1), "malformed"),
        (lambda d: d.update(version=0), r"version must be an integer in 1\.\.2\*\*63-1"),
        (lambda d: d.update(version=2**63), r"version must be an integer in 1\.\.2\*\*63-1"),
        (lambda d: d.update(version=10**30), r"version must be an integer in 1\.\.2\*\*63-1"),
        (lambda d: d["ranks"].pop(), "1 rank entries for 2 engine ranks"),
        (lambda d: d["ranks"][0]["windows"][0].__setitem__(3, 7), "no trainer rank 7"),
        (lambda d: d["ranks"][0]["windows"][0][2][1].__setitem__(1, 17), "outside its view"),
        (lambda d: d["ranks"][1]["windows"][1].__setitem__(5, "c" * 63), "64 hex digits"),
        (lambda d: d.update(check="md5"), "malformed"),
        (lambda d: d["layout"].update(ranks=3), "is not a layout"),
    ],
)
def test_a_malformed_manifest_is_refused_by_what_is_wrong(change, words: str) -> None:
    doc = json.loads(manifest().to_bytes())
    change(doc)
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(RefreshError, match=words):
        VersionManifest.from_bytes(raw)


def test_a_signed_manifest_verifies_and_a_changed_field_does_not(keys) -> None:
    key, pub, other = keys
    m = manifest()
    raw, sig = m.to_bytes(), m.sign(key)
    assert VersionManifest.from_bytes(raw, signature=sig, public_key=pub) == m
    doc = json.loads(raw)
    doc["ranks"][1]["windows"][0][5] = "f" * 64  # a forger's sha256 for its own window bytes
    forged = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert VersionManifest.from_bytes(forged).ranks[1].windows[0].sha256 == "f" * 64  # parses
    with pytest.raises(RefreshError, match="does not verify with .*trainer.pub.pem"):
        VersionManifest.from_bytes(forged, signature=sig, public_key=pub)
    with pytest.raises(RefreshError, match="does not verify with .*other.pub.pem"):
        VersionManifest.from_bytes(raw, signature=sig, public_key=other)
    with pytest.raises(RefreshError, match="is not signed, and this engine takes only"):
        VersionManifest.from_bytes(raw, signature=None, public_key=pub)


def test_a_key_of_another_kind_is_refused_by_name(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ed25519

    k = ed25519.Ed25519PrivateKey.generate()
    path = tmp_path / "ed.pem"
    path.write_bytes(k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    with pytest.raises(RefreshError, match=r"ed\.pem: not an EC private key"):
        manifest().sign(path)


def test_the_layout_travels_as_bytes_and_refuses_what_is_not_one() -> None:
    assert EngineLayout.from_bytes(LAYOUT.to_bytes()) == LAYOUT
    assert EngineLayout.from_bytes(LAYOUT.to_bytes()).model == {"num_heads": 4}
    with pytest.raises(RefreshError, match="engine rank 0 sent no engine layout"):
        EngineLayout.from_bytes(b"\xff not json")
    with pytest.raises(RefreshError, match="is not a layout"):
        EngineLayout("x", 2, 2, "packed", 2)


def test_a_key_given_twice_is_refused_in_the_layout_and_the_manifest() -> None:
    from tpload.refresh.layout import EngineLayout

    raw = LAYOUT.to_bytes()
    assert EngineLayout.from_bytes(raw) == LAYOUT
    twice = raw.replace(b'"tp":2', b'"tp":1,"tp":2')
    with pytest.raises(RefreshError, match="appears twice"):
        EngineLayout.from_bytes(twice)
    m = manifest().to_bytes()
    with pytest.raises(RefreshError, match="not its canonical encoding"):
        VersionManifest.from_bytes(m.replace(b'"version":3', b'"version":9,"version":3'))
