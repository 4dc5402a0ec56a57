"""Signing a load attestation, and checking its signature, the way model-signing signs a model (the
statement as a one-file model, ``FILE.sig`` beside it), so one verifier checks both a signed model
and a signed attestation. model-signing is an optional extra: every entry says what to install when
it is missing.

Keys and bundles are read once by the bounded reader (storage/files.py: ``read_pem``,
``read_small``) and handed to the library as bytes (signing.Held); a signature is checked against
the attestation's bytes as ``attest verify`` read and parsed them, not against the file read
again."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import ModuleType

from ..model.errors import LoadError
from ..model.text import escape_name, first_line
from ..options.rules import signing_missing
from ..storage.files import atomic_path, read_pem, read_small
from ..verification.signing import MAX_BUNDLE_BYTES, Held

SIGNATURE_SUFFIX = ".sig"


def _model_signing() -> ModuleType:
    why = signing_missing()
    if why:
        raise LoadError(why)
    import model_signing

    module: ModuleType = model_signing
    return module


def signature_path(path: str | os.PathLike[str]) -> Path:
    return Path(str(path) + SIGNATURE_SUFFIX)


def sign(path: Path, key: str | os.PathLike[str]) -> Path:
    """Sign the attestation at ``path`` with an EC private key, the way model-signing signs a model
    (the file as a one-file model); the bundle is written beside it and renamed into place."""
    ms = _model_signing()
    from model_signing._signing import sign_ec_key

    out = signature_path(path)
    try:
        pem = read_pem(key, "--attest-key")  # the key's bytes, bounded; the library gets them
        config = ms.signing.Config()
        config._signer = sign_ec_key.Signer(Held(pem, key))  # what use_elliptic_key_signer sets
        with atomic_path(out) as tmp:
            config.sign(path, tmp)
    except Exception as e:  # noqa: BLE001 - model-signing raises ValueError, OSError, cryptography's types
        raise LoadError(
            f"could not sign {escape_name(path)} with {escape_name(key)}: "
            f"{type(e).__name__}: {first_line(e)}"
        ) from None
    return out


def signature_problems(path: Path, data: bytes, key: str | os.PathLike[str]) -> list[str]:
    """The signature beside ``path`` checked with the public key ``key`` by model-signing (the
    bundle against the key, then the sha256 it signs against ``data``: the attestation's bytes as
    they were read): [] when it verifies, else one line saying why."""
    _model_signing()
    from model_signing._signing import sign_ec_key, sign_sigstore_pb

    sig = signature_path(path)
    if not os.path.lexists(sig):
        return [f"{escape_name(sig)}: no signature beside the attestation (--key was given)"]
    bundle = read_small(sig, "attestation signature", limit=MAX_BUNDLE_BYTES)
    pem = read_pem(key, "--key")
    try:
        verifier = sign_ec_key.Verifier(Held(pem, key))
        signed = verifier.verify(sign_sigstore_pb.Signature.read(Held(bundle, sig)))
    except RecursionError:
        return [f"{escape_name(sig)}: not a signature bundle (JSON nested too deeply)"]
    except Exception as e:  # noqa: BLE001 - ValueError for another key; cryptography's, protobuf's for a bad file
        return [
            f"{escape_name(sig)}: does not verify with the key {escape_name(key)}: {first_line(e)}"
        ]
    digests = [(rd.digest.algorithm, rd.digest.digest_hex) for rd in signed.resource_descriptors()]
    if digests != [("sha256", hashlib.sha256(data).hexdigest())]:
        return [
            f"{escape_name(path)}: its bytes are not the ones {escape_name(sig)} signed "
            "(changed since)"
        ]
    return []
