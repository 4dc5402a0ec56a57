"""Signed models (tpload/verification/signing.py, whole_files.SignedFiles / gate.SignedManifest).

Folders are signed with model_signing's own API and EC keys (and a certificate) made here with
``cryptography``; loads are in-process, world 1 (tests/integration/test_signing.py runs torchrun).
Each failure is checked for the file it must name.
"""

from __future__ import annotations

import base64
import datetime
import json
import shutil
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import tpload
from tpload.errors import OptionsError
from tpload.options import LoadOptions
from tpload.tools.published import write_published
from tpload.verification import signing

from ...ckpt_tools import ec_keypair

model_signing = pytest.importorskip("model_signing")
from model_signing import hashing as ms_hashing  # noqa: E402  only once importorskip found it
from model_signing import signing as ms_signing  # noqa: E402  only once importorskip found it

SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    (priv, pub), (_, other) = ec_keypair(folder, "signer"), ec_keypair(folder, "other")
    return {"priv": priv, "pub": pub, "other": other}


def sign(
    folder: Path,
    priv: Path,
    *,
    shard_size: int | None = None,
    hash_: str = "sha256",
    ignore: tuple[str, ...] = (),
) -> Path:
    h = ms_hashing.Config()
    if shard_size:
        h.use_shard_serialization(shard_size=shard_size)
    else:
        h.use_file_serialization(hashing_algorithm=hash_)
    if ignore:
        h.set_ignored_paths(paths=[folder / i for i in ignore])
    ms_signing.Config().use_elliptic_key_signer(private_key=priv).set_hashing_config(h).sign(
        folder, folder / "model.sig"
    )
    return folder / "model.sig"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_published(tmp_path / "m", "gpt-oss-tiny", manifest=False)


def flip(path: Path, at: int = -3) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def shard_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


# -- the library call tpload depends on


def test_the_bundle_only_check_is_where_tpload_calls_it_and_hashes_no_file(
    folder: Path, keys: dict
) -> None:
    """The pinned, non-public call (Config._verifier.verify(Signature.read(path))): if model-signing
    moves it, this fails, and the pin in pyproject.toml must move with a fix."""
    from importlib.metadata import version

    from model_signing import verifying
    from model_signing._signing import sign_sigstore_pb

    assert version("model-signing") == signing.PINNED
    bundle = sign(folder, keys["priv"])
    config = verifying.Config().use_elliptic_key_verifier(public_key=keys["pub"])
    for shard in folder.glob("*.safetensors"):  # the bundle alone: no file is read
        shard.unlink()
    manifest = config._verifier.verify(sign_sigstore_pb.Signature.read(bundle))
    names = {rd.identifier for rd in manifest.resource_descriptors()}
    assert {"config.json", SHARD2, "model.safetensors.index.json"} <= names


# -- loads


def test_a_signed_folder_loads_checked_whole_against_the_signed_digests(
    folder: Path, keys: dict
) -> None:
    sign(folder, keys["priv"])
    shards = tpload.load(folder, progress=False, signer_key=str(keys["pub"]))
    assert "model.sig" in shards.vouched_by and "signs for each file" in shards.vouched_by
    assert shards.report.mine.bytes_hashed == shard_bytes(folder)  # every shard byte, once
    assert any(
        "model.sig: 2 file(s) checked whole against their signed digests" in n
        for n in shards.report.notes
    )
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(shards.state_dict()) == sorted(index)


def test_a_shard_mode_signature_checks_each_piece(folder: Path, keys: dict) -> None:
    sign(folder, keys["priv"], shard_size=1 << 16)  # ~18 pieces a shard
    shards = tpload.load(folder, progress=False, signer_key=str(keys["pub"]))
    assert shards.report.mine.bytes_hashed == shard_bytes(folder)
    flip(folder / SHARD2, 70_000)  # inside the second piece
    with pytest.raises(
        tpload.LoadError, match=rf"{SHARD2}: bytes 65536:131072 do not hash to the digest model.sig"
    ):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))


def test_a_blake3_signature_loads_and_a_blake2_one_is_refused_naming_it(
    folder: Path, keys: dict
) -> None:
    sign(folder, keys["priv"], hash_="blake3")
    assert (
        tpload.load(folder, progress=False, signer_key=str(keys["pub"])).report.mine.bytes_hashed
        > 0
    )
    flip(folder / SHARD2)
    with pytest.raises(tpload.LoadError, match=rf"{SHARD2}: file blake3 .* is not .*signs for it"):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))
    sign(folder, keys["priv"], hash_="blake2")
    with pytest.raises(tpload.LoadError, match="signed with blake2b, which tpload does not check"):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))


def test_a_signed_manifest_is_the_anchor_so_only_used_tensors_are_hashed(
    tmp_path: Path, keys: dict
) -> None:
    folder = write_published(tmp_path / "m", "gpt-oss-tiny")  # with NATIVE_MANIFEST.json
    twin = shutil.copytree(folder, tmp_path / "twin")
    sign(folder, keys["priv"])
    sign(
        twin, keys["priv"], ignore=("NATIVE_MANIFEST.json",)
    )  # the manifest beside it is not signed
    skip = "model.layers.1.mlp.experts.*"
    per_tensor = tpload.load(folder, progress=False, signer_key=str(keys["pub"]), skip=skip)
    whole = tpload.load(twin, progress=False, signer_key=str(keys["pub"]), skip=skip)
    assert "the manifest signed by" in per_tensor.vouched_by
    assert "signs for each file" in whole.vouched_by
    assert any("NATIVE_MANIFEST.json is not signed" in n for n in whole.report.notes)
    assert whole.report.mine.bytes_hashed == shard_bytes(twin)
    assert (
        per_tensor.report.mine.bytes_hashed < whole.report.mine.bytes_hashed * 0.8
    )  # the skipped experts unread
    # the signed manifest changed by a writer of the folder: refused by name before it is read
    doc = json.loads((folder / "NATIVE_MANIFEST.json").read_text())
    (folder / "NATIVE_MANIFEST.json").write_text(json.dumps(doc, indent=3))
    with pytest.raises(
        tpload.LoadError, match="NATIVE_MANIFEST.json: its bytes do not match the digest model.sig"
    ):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))


# -- refusals


def test_a_tampered_shard_fails_naming_it(folder: Path, keys: dict) -> None:
    sign(folder, keys["priv"])
    flip(folder / SHARD2)
    with pytest.raises(
        tpload.LoadError, match=rf"{SHARD2}: file sha256 .* is not .*the digest model.sig signs"
    ):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))


def test_a_tampered_bundle_and_the_wrong_key_fail(folder: Path, keys: dict) -> None:
    bundle = sign(folder, keys["priv"])
    with pytest.raises(
        tpload.LoadError, match="model.sig: the signature does not verify with key .*other"
    ):
        tpload.load(folder, progress=False, signer_key=str(keys["other"]))
    # a writer of the folder edits the signed statement (a shard's digest) and keeps the signature
    doc = json.loads(bundle.read_text())
    payload = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    payload["predicate"]["resources"][-1]["digest"] = "0" * 64
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    bundle.write_text(json.dumps(doc))
    with pytest.raises(tpload.LoadError, match="model.sig: the signature does not verify with key"):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))
    bundle.write_text("{not json")
    with pytest.raises(tpload.LoadError, match="model.sig: not a model-signing bundle"):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))


@pytest.mark.parametrize("unsigned", [SHARD2, "config.json", "model.safetensors.index.json"])
def test_a_file_the_load_reads_must_be_signed(folder: Path, keys: dict, unsigned: str) -> None:
    sign(folder, keys["priv"], ignore=(unsigned,))
    with pytest.raises(
        tpload.LoadError, match=rf"{unsigned}: not (covered by|in the signed statement)"
    ):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))


def test_a_signed_file_missing_fails_naming_it(folder: Path, keys: dict) -> None:
    sign(folder, keys["priv"])
    (folder / SHARD2).unlink()
    with pytest.raises(tpload.LoadError, match=rf"{SHARD2}: signed by model.sig, but missing"):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))


def test_a_signed_config_changed_is_refused_before_it_is_read(folder: Path, keys: dict) -> None:
    sign(folder, keys["priv"])
    cfg = folder / "config.json"
    cfg.write_text(cfg.read_text().replace("GptOssForCausalLM", "LlamaForCausalLM"))
    with pytest.raises(
        tpload.LoadError, match="config.json: its bytes do not match the digest model.sig"
    ):
        signing.precheck(LoadOptions(checkpoint=str(folder), signer_key=str(keys["pub"])))


def test_a_signature_without_a_signer_and_a_signer_without_a_signature(
    folder: Path, keys: dict
) -> None:
    with pytest.raises(
        tpload.LoadError, match="--signer-key given, but .*model.sig does not exist"
    ):
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))
    sign(folder, keys["priv"])
    with pytest.raises(
        tpload.LoadError, match="model.sig: the folder is signed, but no signer was given"
    ):
        tpload.load(folder, progress=False)
    # --signature PATH: a bundle kept elsewhere
    moved = folder.parent / "elsewhere.sig"
    (folder / "model.sig").rename(moved)
    assert tpload.load(
        folder, progress=False, signature=str(moved), signer_key=str(keys["pub"])
    ).state_dict()


def test_without_model_signing_a_signed_folder_is_refused_naming_the_install(
    folder: Path, keys: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    sign(folder, keys["priv"])
    monkeypatch.setitem(
        sys.modules, "model_signing", None
    )  # what an environment without the extra sees
    with pytest.raises(tpload.LoadError) as e:
        tpload.load(folder, progress=False, signer_key=str(keys["pub"]))
    line = str(e.value).splitlines()[-1]
    assert (
        "model.sig: the checkpoint is signed" in line
        and signing.INSTALL in line
        and "not loaded unverified" in line
    )


# -- the signer options


def test_signer_options_are_one_way_each_complete() -> None:
    with pytest.raises(
        OptionsError, match="--signer-key, --signer-chain and --signer-identity are three ways"
    ):
        LoadOptions.from_values({"signer_key": "a.pem", "signer_chain": "c.pem"}, style="cli")
    with pytest.raises(OptionsError, match="signer_identity= needs signer_issuer="):
        LoadOptions.from_values({"signer_identity": "me@example.com"})
    with pytest.raises(OptionsError, match="--signer-cert needs --signer-chain"):
        LoadOptions.from_values({"signer_cert": "leaf.pem"}, style="cli")


def test_a_sigstore_identity_check_offline_fails_in_one_line(folder: Path, keys: dict) -> None:
    """Untested against sigstore itself (no network here): the arguments reach the library, and its
    failure to fetch the trust root is one line saying so."""
    sign(folder, keys["priv"])
    opts = LoadOptions(
        checkpoint=str(folder),
        signer_identity="me@example.com",
        signer_issuer="https://accounts.example.com",
    )
    with pytest.raises(tpload.LoadError) as e:
        signing.precheck(opts)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("--signer-identity: checking") and "needs the network" in str(
        e.value
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    iname = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer[0])]) if issuer else name
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(iname)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca,
                key_cert_sign=ca,
                crl_sign=ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    return b.sign(issuer[1] if issuer else key, hashes.SHA256())


def test_a_certificate_signature_checks_the_chain_and_the_pinned_leaf(
    folder: Path, tmp_path: Path
) -> None:
    ca_key, leaf_key, other_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _cert("test ca", ca_key, None, ca=True)
    files = {
        "ca": ca,
        "leaf": _cert("signer", leaf_key, ("test ca", ca_key), ca=False),
        "other": _cert("other", other_key, ("test ca", ca_key), ca=False),
    }
    for n, c in files.items():
        (tmp_path / f"{n}.pem").write_bytes(c.public_bytes(ser.Encoding.PEM))
    (tmp_path / "leaf.key").write_bytes(
        leaf_key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    )
    ms_signing.Config().use_certificate_signer(
        private_key=tmp_path / "leaf.key",
        signing_certificate=tmp_path / "leaf.pem",
        certificate_chain=[tmp_path / "ca.pem"],
    ).sign(folder, folder / "model.sig")
    chain = str(tmp_path / "ca.pem")
    assert tpload.load(
        folder, progress=False, signer_chain=chain, signer_cert=str(tmp_path / "leaf.pem")
    ).state_dict()
    with pytest.raises(tpload.LoadError, match="signed by another certificate than --signer-cert"):
        tpload.load(
            folder, progress=False, signer_chain=chain, signer_cert=str(tmp_path / "other.pem")
        )
    with pytest.raises(
        tpload.LoadError, match="the signature does not verify with certificate chain"
    ):
        tpload.load(folder, progress=False, signer_chain=str(tmp_path / "other.pem"))
