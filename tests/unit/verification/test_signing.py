"""Signed models (tpload/verification/signing.py, whole_files.SignedFiles / gate.SignedManifest).

Folders are signed with model_signing's own API and EC keys (and a certificate) made here with
``cryptography``; loads are in-process, world 1 (tests/integration/test_signing.py runs torchrun).
Each failure is checked for the file it must name.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import re
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
from tpload.model.errors import OptionsError
from tpload.model.trust import TrustKind
from tpload.options.load_options import LoadOptions
from tpload.storage.files import MAX_PEM_BYTES
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
    """The pinned, non-public call (``Verifier(key).verify(Signature.read(path))``), given the bytes
    tpload read (signing.Held): if model-signing moves it, or reads a path again, this fails, and
    the pin in pyproject.toml must move with a fix."""
    from importlib.metadata import version

    from model_signing._signing import sign_ec_key, sign_sigstore_pb

    assert version("model-signing") == signing.PINNED
    bundle = sign(folder, keys["priv"])
    data, key = bundle.read_bytes(), keys["pub"].read_bytes()
    for f in folder.iterdir():  # no file left: the library gets bytes only
        f.unlink()
    verifier = sign_ec_key.Verifier(signing.Held(key, folder / "gone.pub.pem"))
    manifest = verifier.verify(sign_sigstore_pb.Signature.read(signing.Held(data, bundle)))
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


def _certificate_signed(folder: Path, tmp_path: Path) -> tuple[str, str]:
    """Sign ``folder`` with a leaf certificate of a CA made here; (the CA chain, the leaf) PEMs."""
    ca_key, leaf_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    ca = _cert("test ca", ca_key, None, ca=True)
    for n, c in {
        "ca": ca,
        "leaf": _cert("signer", leaf_key, ("test ca", ca_key), ca=False),
    }.items():
        (tmp_path / f"{n}.pem").write_bytes(c.public_bytes(ser.Encoding.PEM))
    (tmp_path / "leaf.key").write_bytes(
        leaf_key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    )
    ms_signing.Config().use_certificate_signer(
        private_key=tmp_path / "leaf.key",
        signing_certificate=tmp_path / "leaf.pem",
        certificate_chain=[tmp_path / "ca.pem"],
    ).sign(folder, folder / "model.sig")
    return str(tmp_path / "ca.pem"), str(tmp_path / "leaf.pem")


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


# -- the bounded reader: model.sig and the PEM files (issue 28, item 1)


def test_a_bundle_that_is_a_fifo_a_device_or_too_big_is_refused_by_name(
    folder: Path, keys: dict
) -> None:
    opts = LoadOptions(checkpoint=str(folder), signer_key=str(keys["pub"]))
    bundle = folder / "model.sig"
    os.mkfifo(bundle)  # a plain open() would wait for a writer forever
    with pytest.raises(tpload.LoadError, match=r"model.sig: signature bundle is a FIFO; refused"):
        signing.precheck(opts)
    bundle.unlink()
    bundle.symlink_to("/dev/zero")  # read whole, it would fill memory
    with pytest.raises(tpload.LoadError, match=r"model.sig: signature bundle is a device; refused"):
        signing.precheck(opts)
    bundle.unlink()
    with open(bundle, "wb") as f:  # sparse: refused by its size, before a byte is read
        f.truncate(3 << 30)
    with pytest.raises(tpload.LoadError) as e:
        signing.precheck(opts)
    assert str(e.value) == (
        f"{bundle}: signature bundle is {3 << 30} bytes, more than any signature bundle needs "
        f"(at most {signing.MAX_BUNDLE_BYTES}); refused"
    )
    bundle.write_text("[" * 100_000 + "]" * 100_000)  # bad JSON is the bundle's fault
    with pytest.raises(
        tpload.LoadError, match=r"model.sig: not a model-signing bundle: .*nested too deeply"
    ):
        signing.precheck(opts)


def test_pem_files_named_by_options_go_through_the_bounded_reader(
    folder: Path, keys: dict, tmp_path: Path
) -> None:
    sign(folder, keys["priv"])
    fifo = tmp_path / "key.pem"
    os.mkfifo(fifo)
    with pytest.raises(tpload.LoadError, match=r"key.pem: --signer-key file is a FIFO; refused"):
        signing.precheck(LoadOptions(checkpoint=str(folder), signer_key=str(fifo)))
    with pytest.raises(tpload.LoadError, match=r"key.pem: --signer-chain file is a FIFO; refused"):
        signing.precheck(LoadOptions(checkpoint=str(folder), signer_chain=str(fifo)))
    big = tmp_path / "big.pem"
    big.write_bytes(b"-" * (MAX_PEM_BYTES + 1))
    with pytest.raises(
        tpload.LoadError, match=rf"big.pem: --signer-key file is {MAX_PEM_BYTES + 1} bytes"
    ):
        signing.precheck(LoadOptions(checkpoint=str(folder), signer_key=str(big)))
    with pytest.raises(OptionsError, match=r"key.pem: --attest-key file is a FIFO; refused"):
        LoadOptions(attest=str(tmp_path / "a.json"), attest_key=str(fifo))


def test_a_signature_none_with_a_signer_says_the_signer_is_ignored(
    tmp_path: Path, keys: dict
) -> None:
    folder = write_published(tmp_path / "m", "gpt-oss-tiny")  # a manifest: loads without model.sig
    sign(folder, keys["priv"])
    shards = tpload.load(folder, progress=False, signature="none", signer_key=str(keys["pub"]))
    assert "--signer-key is ignored: --signature none checks no signature" in shards.report.notes
    assert shards.trust.kind == TrustKind.MANIFEST  # the folder's other anchor vouched


# -- what the report says vouched (issue 28, item 8)


def test_a_signed_load_names_the_bundle_and_its_signer(tmp_path: Path, keys: dict) -> None:
    folder = write_published(tmp_path / "m", "gpt-oss-tiny")
    twin = shutil.copytree(folder, tmp_path / "twin")
    (twin / "NATIVE_MANIFEST.json").unlink()
    bundle, files = sign(folder, keys["priv"]), sign(twin, keys["priv"])
    fingerprint = signing.key_id(keys["pub"].read_bytes())
    assert re.fullmatch(r"key sha256:[0-9a-f]{16}", fingerprint)
    for root, sig, manifest in ((folder, bundle, True), (twin, files, False)):
        shards = tpload.load(root, progress=False, signer_key=str(keys["pub"]))
        trust = shards.report.to_dict()["trust"]
        assert trust["kind"] == "signature" and trust["file"] == str(sig)
        assert trust["sha256"] == hashlib.sha256(sig.read_bytes()).hexdigest()
        assert trust["signer"] == fingerprint
        assert (trust["manifest"] is not None) == manifest
        line = next(x for x in shards.report.table().splitlines() if x.startswith("verified:"))
        want = f"against model.sig (sha256 {trust['sha256'][:16]}..., signer {fingerprint}"
        assert want in line, line
        if manifest:
            assert (
                f"; it signs NATIVE_MANIFEST.json (sha256 {trust['manifest_sha256'][:16]}" in line
            )


def test_a_certificate_signer_is_named_by_its_subject(folder: Path, tmp_path: Path) -> None:
    chain, leaf = _certificate_signed(folder, tmp_path)
    shards = tpload.load(folder, progress=False, signer_chain=chain, signer_cert=leaf)
    der = x509.load_pem_x509_certificate(Path(leaf).read_bytes()).public_bytes(ser.Encoding.DER)
    assert shards.trust.signer == (
        f"certificate CN=signer (sha256:{hashlib.sha256(der).hexdigest()[:16]})"
    )


# -- verify and manifest on a signed folder (issue 28, item 3)


def test_verify_and_manifest_check_the_signature(
    folder: Path, keys: dict, capsys: pytest.CaptureFixture
) -> None:
    from tpload.cli import main

    sign(folder, keys["priv"])
    key = ["--signer-key", str(keys["pub"])]
    assert main(["verify", str(folder)]) == 1  # no signer: refused, naming the options
    assert "model.sig: the folder is signed, but no signer was given" in capsys.readouterr().err
    assert main(["verify", str(folder), *key]) == 0
    out = capsys.readouterr().out
    fingerprint = signing.key_id(keys["pub"].read_bytes())
    assert f"whole against the digests model.sig (signer {fingerprint}) signs" in out
    assert out.rstrip().endswith(f"{folder}: OK")
    flip(folder / SHARD2)
    assert main(["verify", str(folder), *key]) == 1
    out = capsys.readouterr().out
    assert f"BAD {folder / SHARD2}: file sha256" in out and "the digest model.sig signs" in out
    assert main(["manifest", str(folder), *key]) == 1
    err = capsys.readouterr().err
    assert "no manifest written: 1 problem(s) against" in err and SHARD2 in err
    assert not (folder / "NATIVE_MANIFEST.json").exists()  # nothing vouched over tampered bytes
    assert main(["manifest", str(folder)]) == 1
    assert "the folder is signed, but no signer was given" in capsys.readouterr().err
    assert main(["verify", str(folder), "--signature", "none", *key]) == 1  # no other anchor
    out = capsys.readouterr().out
    assert "note: --signer-key is ignored: --signature none checks no signature" in out


def test_manifest_of_a_signed_folder_writes_over_signed_bytes_only(
    folder: Path, keys: dict, capsys: pytest.CaptureFixture
) -> None:
    from tpload.cli import main

    sign(folder, keys["priv"])
    assert main(["manifest", str(folder), "--signer-key", str(keys["pub"])]) == 0
    assert (folder / "NATIVE_MANIFEST.json").is_file()
    # the manifest is not signed: the load still checks the signed file digests, and says so
    shards = tpload.load(folder, progress=False, signer_key=str(keys["pub"]))
    assert shards.trust.kind == TrustKind.SIGNATURE and shards.trust.manifest is None


def test_verify_of_a_signed_manifest_checks_tensors_against_it(
    tmp_path: Path, keys: dict, capsys: pytest.CaptureFixture
) -> None:
    from tpload.cli import main

    folder = write_published(tmp_path / "m", "gpt-oss-tiny")  # NATIVE_MANIFEST.json signed too
    sign(folder, keys["priv"])
    key = ["--signer-key", str(keys["pub"]), "--config", "none"]
    assert main(["verify", str(folder), *key]) == 0
    out = capsys.readouterr().out
    assert "NATIVE_MANIFEST.json (pin loads to it with --manifest-sha256" in out
    assert "the manifest signed by" in out
    flip(folder / SHARD2)  # a data byte: the per-tensor sha256 against the signed manifest sees it
    assert main(["verify", str(folder), *key]) == 1
    out = capsys.readouterr().out
    assert f"BAD {folder / SHARD2}: tensor " in out and "does not match the manifest's" in out
    assert main(["manifest", str(folder), "--force", "--signer-key", str(keys["pub"])]) == 1
    assert "no manifest written: 1 problem(s) against" in capsys.readouterr().err
