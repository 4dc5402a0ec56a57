"""Signed models (OpenSSF model signing): a ``model.sig`` bundle checked when a folder is loaded.

``model_signing`` (sigstore/model-transparency) signs a folder into a Sigstore bundle: a DSSE
envelope over an in-toto statement whose predicate lists every file (or every fixed-size shard
``path:start:end`` of a file, in its shard mode) with its digest, signed by a key, a certificate or
a sigstore identity. tpload splits the library's ``verify`` in two:

* the library checks the bundle alone (the envelope's signature against the key, the certificate
  chain or the sigstore identity; the statement's type and root digest) and returns the signed
  manifest. Nothing of DSSE, in-toto or X.509 is re-implemented here;
* tpload's own hashing checks the bytes against that manifest while loading, once per node: the
  signed file (or piece) digests are expected like hub blob names
  (``whole_files.SignedFiles``), or, when
  ``NATIVE_MANIFEST.json`` is among the signed files, its per-tensor digests are the anchor
  (``gate.SignedManifest``: each rank hashes only its windows' tensors).

The library's public ``verify`` hashes every file of the folder again. Checking the bundle alone is
``Verifier(key).verify(Signature.read(path))``, which is not public: the ``[signing]`` extra pins
model-signing to the version read (:data:`PINNED`), and tests/unit/verification/test_signing.py
fails when the call moves. The bundle, the key and the certificates are read once, by the bounded
reader of regular files (``storage/files.read_small``, with :data:`MAX_BUNDLE_BYTES` and
storage/files.py's ``MAX_PEM_BYTES``), and their bytes handed to the library (:class:`Held`): a
FIFO, a device or a huge file in their place is refused by name, and what is verified is what was
read.

:func:`precheck` runs before the storage opens (loading/sequence.py), on every rank: the bundle,
then the JSON files that shape the plan (config.json, hf_quant_config.json, the index, a signed
manifest), each checked against its signed digest before anything reads it. An uncovered one is
refused.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Protocol

from ..model.errors import LoadError
from ..model.text import escape_name
from ..model.values import INDEX_NAME, MANIFEST_NAME, SIGNER_FIELDS
from ..storage.files import parse_json, read_pem, read_small
from . import hashes
from .hashes import Expected, HashObject

BUNDLE = "model.sig"
NONE = "none"
"""``--signature none``: ignore a DIR/model.sig (the load uses the folder's other anchors)."""
INSTALL = "pip install -e '.[signing]'"
PINNED = "1.1.1"
"""The model-signing release whose non-public bundle check this module calls."""
PLAN_FILES = ("config.json", "hf_quant_config.json", INDEX_NAME, MANIFEST_NAME)
"""JSON files that shape the plan: each present one must be signed, and is checked before it is
read."""
SIGNER_FLAGS = (
    "--signer-key PEM, --signer-chain PEM [--signer-cert PEM] or --signer-identity ID "
    "--signer-issuer URL"
)
FIX = "the file changed since it was signed (or the signature is not for this folder)"
MAX_BUNDLE_BYTES = 64 << 20
"""model.sig's size limit. A bundle names each signed file (or shard-mode piece) in about 250 bytes
(200 files: 50 KB; a 700 GB model in model-signing's default 1 GB pieces: under 200 KB), so 64 MiB
holds some 250,000: far more than any checkpoint, and little for a rank to hold."""


class Held:
    """Bytes read once by the bounded reader, offered to model-signing where it takes a path: its
    readers (``Signature.read``, the key and certificate verifiers) call only ``read_bytes`` or
    ``read_text`` on it, so the library never opens the file again."""

    def __init__(self, data: bytes, path: str | os.PathLike[str]) -> None:
        self.data, self.path = data, Path(path)

    def read_bytes(self) -> bytes:
        return self.data

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.data.decode(encoding, errors)

    def __str__(self) -> str:
        return str(self.path)


class Signer(Protocol):
    """The options :func:`precheck` reads: the folder, the verify mode, which bundle and which
    signer (LoadOptions and :class:`SignerOptions` satisfy it)."""

    @property
    def checkpoint(self) -> str | None: ...

    @property
    def verify(self) -> str: ...

    @property
    def signature(self) -> str | None: ...

    @property
    def signer_key(self) -> str | None: ...

    @property
    def signer_cert(self) -> str | None: ...

    @property
    def signer_chain(self) -> str | None: ...

    @property
    def signer_identity(self) -> str | None: ...

    @property
    def signer_issuer(self) -> str | None: ...


@dataclass(frozen=True)
class SignerOptions:
    """The options :func:`precheck` reads, for the subcommands that check a folder without loading
    it (``verify``, ``manifest``, ``attest verify``): their flags are the load's."""

    checkpoint: str
    signature: str | None = None
    signer_key: str | None = None
    signer_cert: str | None = None
    signer_chain: str | None = None
    signer_identity: str | None = None
    signer_issuer: str | None = None
    verify: str = "node"
    """Always a hashing mode: these commands hash every byte they vouch for."""

    @classmethod
    def of(cls, ns: argparse.Namespace, checkpoint: str | os.PathLike[str]) -> SignerOptions:
        """From parsed flags (absent ones are None)."""
        given = {f: getattr(ns, f, None) for f in SIGNER_FIELDS}
        return cls(
            str(checkpoint),
            signature=given["signature"],
            signer_key=given["signer_key"],
            signer_cert=given["signer_cert"],
            signer_chain=given["signer_chain"],
            signer_identity=given["signer_identity"],
            signer_issuer=given["signer_issuer"],
        )


@dataclass(frozen=True)
class SignedModel:
    """What a verified bundle vouches for: each signed file's digest, or its pieces'."""

    bundle: Path
    root: Path
    signer: str
    """The signer checked, in words (``key k.pem``)."""
    bundle_sha256: str
    """The sha256 of the bundle's bytes as read and verified (the attestation's subject)."""
    signer_id: str
    """Who signed, as the bundle proves it: ``key sha256:<16 hex>`` (of the public key's DER),
    ``certificate <subject> (sha256:<16 hex>)`` (the signing certificate), or the sigstore
    identity and issuer (the report and the attestation name it)."""
    whole: Mapping[str, tuple[str, str]]
    """Relative path -> (hash, hex digest) of whole files."""
    pieces: Mapping[str, Mapping[tuple[int, int], str]]
    """Relative path -> {(start, end): sha256} of shard-mode signatures."""
    manifest_sha256: str | None = None
    """The sha256 of NATIVE_MANIFEST.json's bytes, when it is signed and matched (the anchor
    then)."""

    def covers(self, name: str) -> bool:
        return name in self.whole or name in self.pieces

    @property
    def what(self) -> str:
        return f"{escape_name(self.bundle)} ({self.signer})"

    def expected_of(self, name: str) -> Expected:
        source = f"the digest {escape_name(self.bundle.name)} signs for it"
        if name in self.pieces:
            return Expected(pieces=self.pieces[name], source=source, fix=FIX)
        hash_, digest = self.whole[name]
        return Expected(hash=hash_, whole=digest, source=source, fix=FIX)

    def _rel(self, path: Path) -> str:
        try:
            return Path(path).absolute().relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def expected(self, paths: Iterable[Path]) -> dict[Path, Expected]:
        """Each file's signed digest(s), for the whole-file hasher (whole_files.SignedFiles)."""
        return {p: self.expected_of(self._rel(p)) for p in paths if self.covers(self._rel(p))}

    def check_covered(self, paths: Iterable[Path]) -> None:
        """Every file the load may read is signed (raised once, naming each that is not)."""
        bare = [p for p in paths if not self.covers(self._rel(p))]
        if bare:
            raise LoadError(
                f"{len(bare)} file(s) the load reads are not covered by {self.what}; an unsigned "
                "file is never loaded from a signed folder:\n  - "
                + "\n  - ".join(f"{escape_name(p)}: not in the signed statement" for p in bare)
            )

    def check_manifest(self, parsed_sha256: str | None) -> None:
        """The manifest the catalogue parsed is the one whose signed bytes were checked."""
        if parsed_sha256 != self.manifest_sha256:
            raise LoadError(
                f"{escape_name(self.root / MANIFEST_NAME)}: the manifest read (sha256 "
                f"{(parsed_sha256 or 'none')[:16]}...) is not the one checked against {self.what}: "
                "it changed while loading"
            )


def bundle_path(opts: Signer) -> Path | None:
    """The bundle this load checks: ``--signature``, else DIR/model.sig when present; None when the
    load does not hash (``--verify off`` or ``digest``) or ``--signature none``."""
    if opts.checkpoint is None or opts.verify not in ("node", "rank") or opts.signature == NONE:
        return None  # (a stand-in for LoadOptions without a checkpoint: no folder, no bundle)
    if opts.signature:
        return Path(opts.signature).absolute()
    default = Path(opts.checkpoint).absolute() / BUNDLE
    return default if os.path.lexists(default) else None


def precheck(opts: Signer, *, notes: list[str] | None = None) -> SignedModel | None:
    """Verify the load's bundle (if any) and its plan-shaping JSON files; raise LoadError naming
    what fails. Called before the storage opens, and again by the gate (the bundle check is
    reused). ``notes`` gets a line when a signer option is given but no signature is checked."""
    path = bundle_path(opts)
    if opts.checkpoint is None:
        return None
    signer = _signer(opts)
    if path is None:
        if signer and opts.signature != NONE and opts.verify in ("node", "rank"):
            raise LoadError(
                f"{signer[0]} given, but {escape_name(Path(opts.checkpoint or '.') / BUNDLE)} "
                "does not exist: name the bundle with --signature PATH"
            )
        if signer and notes is not None:
            why = "--signature none" if opts.signature == NONE else f"--verify {opts.verify}"
            notes.append(f"{signer[0]} is ignored: {why} checks no signature")
        return None
    if not signer:
        raise LoadError(
            f"{escape_name(path)}: the folder is signed, but no signer was given to check it "
            f"against: add {SIGNER_FLAGS} (or --signature none to use the folder's other "
            "anchors)"
        )
    # read once, bounded: a FIFO, a device or a huge file here is refused before the library
    data = read_small(path, "signature bundle", limit=MAX_BUNDLE_BYTES)
    root = Path(opts.checkpoint).absolute()
    model = _verify(path, data, root, opts, signer[1])
    return replace(model, manifest_sha256=_check_plan_files(model))


def _signer(opts: Signer) -> tuple[str, str] | None:
    """(the flag used, the signer in words), or None when no signer option is set."""
    if opts.signer_key:
        return "--signer-key", f"key {opts.signer_key}"
    if opts.signer_chain:
        pin = f", certificate {opts.signer_cert}" if opts.signer_cert else ""
        return "--signer-chain", f"certificate chain {opts.signer_chain}{pin}"
    if opts.signer_identity:
        return (
            "--signer-identity",
            f"sigstore identity {opts.signer_identity} from {opts.signer_issuer}",
        )
    return None


def _library(path: Path) -> tuple[ModuleType, ModuleType, ModuleType, ModuleType]:
    """model_signing's modules, or one line naming the install (a signed folder is never loaded
    unverified)."""
    try:
        import model_signing  # noqa: F401  the package first: without the extra, this fails
        from model_signing._signing import (
            sign_certificate,
            sign_ec_key,
            sign_sigstore,
            sign_sigstore_pb,
        )
    except ImportError as e:
        raise LoadError(
            f"{escape_name(path)}: the checkpoint is signed, but checking signatures needs "
            f"model-signing {PINNED} and pyopenssl ({e.name or e} is missing): {INSTALL}; it is "
            "not loaded unverified"
        ) from None
    return sign_ec_key, sign_certificate, sign_sigstore, sign_sigstore_pb


def _why(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def key_id(pem: bytes) -> str:
    """``key sha256:<16 hex>``: the sha256 of a public key's DER (SubjectPublicKeyInfo), the
    signer's name in the report and the attestation (raises ValueError for what is not one)."""
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_public_key,
    )

    der = load_pem_public_key(pem).public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return f"key sha256:{hashlib.sha256(der).hexdigest()[:16]}"


class _Verifier(Protocol):
    """model-signing's verifier of a bundle (its key, certificate or sigstore kind)."""

    def verify(self, signature: _Signature, /) -> _Manifest: ...


class _Signature(Protocol):
    """A read bundle (model-signing's ``Signature``): its sigstore bundle is read for the signing
    certificate."""

    @property
    def bundle(self) -> _Bundle: ...


class _Bundle(Protocol):
    @property
    def verification_material(self) -> _Material: ...


class _Material(Protocol):
    @property
    def x509_certificate_chain(self) -> _Chain: ...


class _Chain(Protocol):
    @property
    def certificates(self) -> list[_Certificate]: ...


class _Certificate(Protocol):
    @property
    def raw_bytes(self) -> bytes: ...


class _Manifest(Protocol):
    """What a verified bundle signs (model-signing's manifest)."""

    @property
    def serialization_type(self) -> Mapping[str, str]: ...

    def resource_descriptors(self) -> Iterable[_Resource]: ...


class _Resource(Protocol):
    @property
    def identifier(self) -> str: ...

    @property
    def digest(self) -> _Digest: ...


class _Digest(Protocol):
    @property
    def algorithm(self) -> str: ...

    @property
    def digest_hex(self) -> str: ...


Modules = tuple[ModuleType, ModuleType, ModuleType, ModuleType]


def _verifier(path: Path, opts: Signer, modules: Modules) -> tuple[_Verifier, bytes | None]:
    """The library's verifier for the signer options, and the key's bytes (for its fingerprint)."""
    ec_key, certificate, sigstore, _ = modules
    # the files first, each read once and bounded (their errors name the flag and the file)
    key = read_pem(opts.signer_key, "--signer-key") if opts.signer_key else None
    chain = read_pem(opts.signer_chain, "--signer-chain") if opts.signer_chain else None
    # Any error below comes from the library (key parsing, certificate stores, sigstore's trust
    # root): many types, each turned into one line.
    try:
        verifier: _Verifier
        if key is not None and opts.signer_key is not None:
            verifier = ec_key.Verifier(Held(key, opts.signer_key))
            return verifier, key
        if chain is not None and opts.signer_chain is not None:
            verifier = certificate.Verifier([Held(chain, opts.signer_chain)])
            return verifier, None
        identity, issuer = opts.signer_identity, opts.signer_issuer
        verifier = sigstore.Verifier(identity=identity, oidc_issuer=issuer)
        return verifier, None
    except Exception as e:  # noqa: BLE001 - the library's errors, reported in one line
        if opts.signer_identity:
            raise LoadError(
                f"--signer-identity: checking {escape_name(path)} against a sigstore identity "
                f"needs the network (sigstore's trust root), which failed: {_why(e)}; sign with a "
                "key or a certificate to check offline"
            ) from None
        flag = "--signer-key" if opts.signer_key else "--signer-chain"
        raise LoadError(
            f"{flag} {escape_name(opts.signer_key or opts.signer_chain)}: cannot be used to check "
            f"signatures: {_why(e)}"
        ) from None


def _verify(path: Path, data: bytes, root: Path, opts: Signer, signer: str) -> SignedModel:
    """The library checks the bundle's bytes alone and returns the signed manifest (no file is
    hashed, none is opened again)."""
    modules = _library(path)
    verifier, key = _verifier(path, opts, modules)
    try:  # bad JSON (or JSON nested past the parser's depth) is the bundle's fault, said as such
        parse_json(data, path, "signature bundle")
    except LoadError as e:
        raise LoadError(f"{escape_name(path)}: not a model-signing bundle: {e}") from None
    _, _, sigstore, sigstore_pb = modules
    reader = sigstore if opts.signer_identity else sigstore_pb
    try:
        signature: _Signature = reader.Signature.read(Held(data, path))
    except Exception as e:  # noqa: BLE001
        raise LoadError(f"{escape_name(path)}: not a model-signing bundle: {_why(e)}") from None
    try:
        manifest = verifier.verify(signature)  # the bundle alone (not public: the module's doc)
    except Exception as e:  # noqa: BLE001
        raise LoadError(
            f"{escape_name(path)}: the signature does not verify with {signer}: {_why(e)}; the "
            "folder is not vouched for by that signer"
        ) from None
    if key is not None:
        signer_id = key_id(key)  # the library parsed it: it is a public key
    elif opts.signer_chain:
        signer_id = _check_leaf(path, signature, opts.signer_cert)
    else:
        signer_id = f"sigstore identity {opts.signer_identity} (issuer {opts.signer_issuer})"
    digest = hashlib.sha256(data).hexdigest()
    return _digests(path, root, manifest, signer, digest, signer_id)


def _check_leaf(path: Path, signature: _Signature, cert: str | None) -> str:
    """The signing certificate in the bundle (its chain verified), named by subject and sha256;
    ``--signer-cert``: it must also be this one."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    pinned = read_pem(cert, "--signer-cert") if cert else None
    try:
        got = signature.bundle.verification_material.x509_certificate_chain.certificates[
            0
        ].raw_bytes
        leaf = x509.load_der_x509_certificate(got)
        want = x509.load_pem_x509_certificate(pinned).public_bytes(Encoding.DER) if pinned else got
    except (ValueError, AttributeError, IndexError) as e:
        raise LoadError(
            f"--signer-cert {escape_name(cert)}: cannot compare with the certificate in "
            f"{escape_name(path)}: {_why(e)}"
            if cert
            else f"{escape_name(path)}: cannot read its signing certificate: {_why(e)}"
        ) from None
    if got != want:
        raise LoadError(
            f"{escape_name(path)}: signed by another certificate than --signer-cert "
            f"{escape_name(cert)} (it chains to --signer-chain, but is not the one pinned)"
        )
    subject = leaf.subject.rfc4514_string() or "(no subject)"
    return f"certificate {escape_name(subject)} (sha256:{hashlib.sha256(got).hexdigest()[:16]})"


def _digests(
    path: Path, root: Path, manifest: _Manifest, signer: str, bundle_sha256: str, signer_id: str
) -> SignedModel:
    """The signed manifest as expected digests; any hash but sha256 (and blake3 with its extra)
    refused."""
    method = manifest.serialization_type.get("method", "files")
    whole: dict[str, tuple[str, str]] = {}
    pieces: dict[str, dict[tuple[int, int], str]] = {}
    refused: set[str] = set()
    for rd in manifest.resource_descriptors():
        algorithm, digest = rd.digest.algorithm, rd.digest.digest_hex
        if method == "shards":
            name, start, end = rd.identifier.rsplit(":", 2)
            if algorithm.split("-sharded-")[0] != "sha256":
                refused.add(algorithm)
            pieces.setdefault(name, {})[(int(start), int(end))] = digest
        else:
            if algorithm not in ("sha256", "blake3"):
                refused.add(algorithm)
            whole[rd.identifier] = (algorithm, digest)
    if refused:
        raise LoadError(
            f"{escape_name(path)}: signed with {', '.join(sorted(refused))}, which tpload does "
            "not check; it checks sha256 digests (whole files or shards) and blake3 (whole "
            "files): re-sign with one"
        )
    if any(h == "blake3" for h, _ in whole.values()) and not hashes.available():
        raise LoadError(
            f"{escape_name(path)}: signed with blake3 digests, but the blake3 package is not "
            f"installed: {hashes.INSTALL}"
        )
    for name, cuts in pieces.items():
        ends = [0] + [b for _, b in sorted(cuts)][:-1]
        if [a for a, _ in sorted(cuts)] != ends:
            raise LoadError(
                f"{escape_name(path)}: the signed shards of {escape_name(name)} do not tile the "
                "file"
            )
    return SignedModel(path, root, signer, bundle_sha256, signer_id, whole, pieces)


def _digest_problems(model: SignedModel, name: str, data: bytes) -> str | None:
    """Why these bytes are not what the bundle signs for ``name`` (None when they are)."""
    want = model.expected_of(name)
    if want.pieces:
        ok = max(e for _, e in want.pieces) == len(data) and all(
            hashlib.sha256(data[a:b]).hexdigest() == d for (a, b), d in want.pieces.items()
        )
    else:
        h: HashObject = (
            hashes.new_blake3(len(data), 1) if want.hash == "blake3" else hashlib.sha256()
        )
        h.update(data)
        ok = h.hexdigest() == want.whole
    return (
        None
        if ok
        else f"{escape_name(model.root / name)}: its bytes do not match {want.source}: {FIX}"
    )


def _check_plan_files(model: SignedModel) -> str | None:
    """Check each plan-shaping JSON file (and that every signed shard exists) before anything reads
    them; the sha256 of NATIVE_MANIFEST.json's bytes when it is signed and matched."""
    problems, manifest_sha = [], None
    for name in PLAN_FILES:
        p = model.root / name
        if not os.path.lexists(p):
            if model.covers(name):
                problems.append(
                    f"{escape_name(p)}: signed by {escape_name(model.bundle.name)}, but missing"
                )
            continue
        if not model.covers(name):
            if (
                name != MANIFEST_NAME
            ):  # an unsigned manifest is not an anchor (whole_files.SignedFiles notes it)
                problems.append(
                    f"{escape_name(p)}: not covered by {model.what}; it shapes the plan, so it "
                    "must be signed"
                )
            continue
        data = read_small(p, name)
        why = _digest_problems(model, name, data)
        if why:
            problems.append(why)
        elif name == MANIFEST_NAME:
            manifest_sha = hashlib.sha256(data).hexdigest()
    shards = sorted(n for n in (*model.whole, *model.pieces) if n.endswith(".safetensors"))
    problems += [
        f"{escape_name(model.root / n)}: signed by {escape_name(model.bundle.name)}, but missing"
        for n in shards
        if not os.path.lexists(model.root / n)
    ]
    if problems:
        raise LoadError(
            f"{len(problems)} problem(s) with the signed folder {escape_name(model.root)}:\n  - "
            + "\n  - ".join(problems)
        )
    return manifest_sha
