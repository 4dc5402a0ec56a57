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
``Config._verifier.verify(Signature.read(path))``, which is not public: the ``[signing]`` extra pins
model-signing to the version read (:data:`PINNED`), and tests/unit/verification/test_signing.py
fails when the call moves.

:func:`precheck` runs before the storage opens (api.py), on every rank: the bundle, then the JSON
files that shape the plan (config.json, hf_quant_config.json, the index, a signed manifest), each
checked against its signed digest before anything reads it. An uncovered one is refused.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import LoadError
from ..storage.files import read_small
from ..storage.pins import INDEX_NAME, MANIFEST_NAME
from ..text import escape_name
from . import blake3sums
from .files import Expected

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
"""Bundles already verified in this process (the bundle's bytes, the signer): the gate reuses the
check made before the storage opened, and a sigstore check goes to the network once."""


@dataclass(frozen=True)
class SignedModel:
    """What a verified bundle vouches for: each signed file's digest, or its pieces'."""

    bundle: Path
    root: Path
    signer: str
    """The signer checked, in words (``key k.pem``)."""
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


def bundle_path(opts: object) -> Path | None:
    """The bundle this load checks: ``--signature``, else DIR/model.sig when present; None when the
    load does not hash (``--verify off`` or ``digest``) or ``--signature none``."""
    if (
        getattr(opts, "checkpoint", None) is None
        or opts.verify not in ("node", "rank")
        or opts.signature == NONE
    ):
        return None  # (a stand-in for LoadOptions without a checkpoint: no folder, no bundle)
    if opts.signature:
        return Path(opts.signature).absolute()
    default = Path(opts.checkpoint).absolute() / BUNDLE
    return default if os.path.lexists(default) else None


def precheck(opts: object) -> SignedModel | None:
    """Verify the load's bundle (if any) and its plan-shaping JSON files; raise LoadError naming
    what fails. Called before the storage opens, and again by the gate (the bundle check is
    reused)."""
    path = bundle_path(opts)
    if path is None and getattr(opts, "checkpoint", None) is None:
        return None
    signer = _signer(opts)
    if path is None:
        if signer and opts.signature != NONE and opts.verify in ("node", "rank"):
            raise LoadError(
                f"{signer[0]} given, but {escape_name(Path(opts.checkpoint or '.') / BUNDLE)} "
                "does not exist: name the bundle with --signature PATH"
            )
        return None
    if not signer:
        raise LoadError(
            f"{escape_name(path)}: the folder is signed, but no signer was given to check it "
            f"against: add {SIGNER_FLAGS} (or --signature none to load by the folder's other "
            "anchors)"
        )
    try:  # readable, or one line saying why (before the library's own error for it)
        with open(path, "rb"):
            pass
    except OSError as e:
        raise LoadError(
            f"{escape_name(path)}: cannot read the signature bundle: {e.strerror or e}"
        ) from None
    root = Path(opts.checkpoint).absolute()
    model = _verify(path, root, opts, signer[1])
    return replace(model, manifest_sha256=_check_plan_files(model))


def _signer(opts: object) -> tuple[str, str] | None:
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


def _library(path: Path) -> object:
    """model_signing's modules, or one line naming the install (a signed folder is never loaded
    unverified)."""
    try:
        from model_signing import verifying
        from model_signing._signing import sign_sigstore, sign_sigstore_pb
    except ImportError as e:
        raise LoadError(
            f"{escape_name(path)}: the checkpoint is signed, but checking signatures needs "
            f"model-signing {PINNED} and pyopenssl ({e.name or e} is missing): {INSTALL}; it is "
            "not loaded unverified"
        ) from None
    return verifying, sign_sigstore, sign_sigstore_pb


def _why(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def _verify(path: Path, root: Path, opts: object, signer: str) -> SignedModel:
    """The library checks the bundle alone and returns the signed manifest (no file is hashed)."""
    verifying, sign_sigstore, sign_sigstore_pb = _library(path)
    config = verifying.Config()
    # Any error below comes from the library (key parsing, certificate stores, sigstore's trust
    # root, the bundle's JSON and protobuf, the signature): many types, each turned into one line.
    try:
        if opts.signer_key:
            config.use_elliptic_key_verifier(public_key=opts.signer_key)
        elif opts.signer_chain:
            config.use_certificate_verifier(certificate_chain=[opts.signer_chain])
        else:
            config.use_sigstore_verifier(
                identity=opts.signer_identity, oidc_issuer=opts.signer_issuer
            )
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
    reader = sign_sigstore if opts.signer_identity else sign_sigstore_pb
    try:
        signature = reader.Signature.read(path)
    except Exception as e:  # noqa: BLE001
        raise LoadError(f"{escape_name(path)}: not a model-signing bundle: {_why(e)}") from None
    try:
        manifest = config._verifier.verify(
            signature
        )  # the bundle alone (not public: see the module's doc)
    except Exception as e:  # noqa: BLE001
        raise LoadError(
            f"{escape_name(path)}: the signature does not verify with {signer}: {_why(e)}; the "
            "folder is not vouched for by that signer"
        ) from None
    if opts.signer_cert:
        _check_leaf(path, signature, opts.signer_cert)
    return _digests(path, root, manifest, signer)


def _check_leaf(path: Path, signature: object, cert: str) -> None:
    """``--signer-cert``: the chain verified, the signing certificate must also be this one."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    try:
        want = x509.load_pem_x509_certificate(Path(cert).read_bytes()).public_bytes(Encoding.DER)
        got = signature.bundle.verification_material.x509_certificate_chain.certificates[
            0
        ].raw_bytes
    except (OSError, ValueError, AttributeError, IndexError) as e:
        raise LoadError(
            f"--signer-cert {escape_name(cert)}: cannot compare with the certificate in "
            f"{escape_name(path)}: {_why(e)}"
        ) from None
    if got != want:
        raise LoadError(
            f"{escape_name(path)}: signed by another certificate than --signer-cert "
            f"{escape_name(cert)} (it chains to --signer-chain, but is not the one pinned)"
        )


def _digests(path: Path, root: Path, manifest: object, signer: str) -> SignedModel:
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
    if any(h == "blake3" for h, _ in whole.values()) and not blake3sums.available():
        raise LoadError(
            f"{escape_name(path)}: signed with blake3 digests, but the blake3 package is not "
            f"installed: {blake3sums.INSTALL}"
        )
    for name, cuts in pieces.items():
        ends = [0] + [b for _, b in sorted(cuts)][:-1]
        if [a for a, _ in sorted(cuts)] != ends:
            raise LoadError(
                f"{escape_name(path)}: the signed shards of {escape_name(name)} do not tile the "
                "file"
            )
    return SignedModel(path, root, signer, whole, pieces)


def _digest_problems(model: SignedModel, name: str, data: bytes) -> str | None:
    """Why these bytes are not what the bundle signs for ``name`` (None when they are)."""
    want = model.expected_of(name)
    if want.pieces:
        ok = max(e for _, e in want.pieces) == len(data) and all(
            hashlib.sha256(data[a:b]).hexdigest() == d for (a, b), d in want.pieces.items()
        )
    else:
        h = blake3sums.new_blake3(len(data), 1) if want.hash == "blake3" else hashlib.sha256()
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
