"""The rules across options and on the paths they name, checked before any byte is read: a problem
found after the load (or after all the hashing) costs the whole load, a report written into the
checkpoint destroys it, and a digest store inside it would let its writer vouch for it. Each rule
returns its problems worded with the option spelled as the caller spelled it (``spell``:
``report=`` for ``load()``, ``--report`` on the command line)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast

from ..model.errors import LoadError
from ..model.text import escape_name, first_line

Spell = Callable[[str], str]


def problems_across(values: Mapping[str, object], spell: Spell) -> list[str]:
    """Every problem of these (already typed) values that no one option has alone."""
    # the path rules' modules are imported when they run: every command line builds these options'
    # flags, and `python -m tpload --help` stays cheap
    from ..storage.files import STDOUT, report_in_checkpoint, target_problem
    from ..verification.store import in_checkpoint

    problems = _signer_problems(values, spell)
    report = values.get("report")
    if report and report != STDOUT:  # `-`: rank 0 writes the JSON on standard output
        where = spell("report")
        folder = Path(str(report)).absolute().parent
        if not folder.is_dir():
            problems.append(
                f"{where} {report}: folder {folder} does not exist (checked before "
                "loading, so the report cannot fail after the load)"
            )
        elif Path(str(report)).is_dir():
            problems.append(f"{where} {report} is a folder; name the file to write")
        elif values.get("checkpoint") and (
            why := report_in_checkpoint(str(report), str(values["checkpoint"]))
        ):
            problems.append(
                f"{where} {report} {why}; the report never writes into the checkpoint it loads: "
                "name a file outside it"
            )
        elif why := target_problem(str(report)):
            problems.append(f"{where} {report} {why}")
    store = values.get("digest_store")
    if store and (why := not_a_folder(str(store))):
        problems.append(
            f"{spell('digest_store')} {store}: {why} (the digest store is a folder, made "
            "if missing; give a folder, or leave the option out for the default)"
        )
    elif values.get("checkpoint") and (
        why := in_checkpoint(str(store) if store else None, str(values["checkpoint"]))
    ):
        problems.append(f"{why}: give {spell('digest_store')} a folder outside it")
    # the values are typed (options/load_options.py's _coerce): the caller's groups of ranks
    groups = cast(Sequence[Sequence[int]] | None, values.get("replica_group"))
    replicas = cast(int | None, values.get("replicas"))
    if groups and (replicas or 1) != 1:
        problems.append(
            f"{spell('replicas')} {values['replicas']} with "
            f"{spell('replica_group')} ({len(groups)} groups of {len(groups[0])}): give "
            "one of them (the groups' size is the number of replicas)"
        )
    if ((replicas or 1) > 1 or groups) and values.get("verify") == "rank":
        what = (
            f"{spell('replica_group')} ({len(groups)} groups)"
            if groups
            else f"{spell('replicas')} {values['replicas']}"
        )
        problems.append(
            f"{what} with {spell('verify')} rank: a receiving rank never sees the whole "
            "stored tensor, so it cannot hash what it serves; use node (the reading rank hashes, "
            "receivers check its fingerprints)"
        )
    return problems + _attest_problems(values, spell)


def _attest_problems(values: Mapping[str, object], spell: Spell) -> list[str]:
    """``attest``/``attest_key``: checked before loading, so nothing fails after the verdict but a
    write."""
    from ..storage.files import report_in_checkpoint  # when it runs, as in problems_across

    attest, key = values.get("attest"), values.get("attest_key")
    problems = []
    if attest and values.get("verify") == "off":
        problems.append(
            f"{spell('attest')} {attest}: nothing to attest with "
            f"{spell('verify')} off (no byte was checked)"
        )
    folder = Path(str(attest)).absolute().parent if attest else None
    if attest == "-":  # unlike --report -: a statement is a file, with its signature beside it
        problems.append(
            f"{spell('attest')} -: the attestation is written to a file (FILE.sig beside it when "
            "signed), never to standard output; name the file"
        )
    elif folder is not None and not folder.is_dir():  # (a folder: attest is named)
        problems.append(f"{spell('attest')} {attest}: folder {folder} does not exist")
    elif attest and (
        Path(str(attest)).is_dir() or (key and Path(str(attest) + ".sig").is_dir())
    ):  # refused now, as --report is: after the verdict it would fail rank 0 alone
        what = attest if Path(str(attest)).is_dir() else f"{attest}.sig"
        problems.append(f"{spell('attest')} {what} is a folder; name the file to write")
    elif folder is not None and not os.access(folder, os.W_OK | os.X_OK):
        problems.append(
            f"{spell('attest')} {attest}: folder {folder} is not writable (checked before "
            "loading, so the statement cannot fail after the load)"
        )
    elif (
        attest
        and values.get("checkpoint")
        and (why := report_in_checkpoint(str(attest), str(values["checkpoint"])))
    ):
        problems.append(
            f"{spell('attest')} {attest} {why}; the attestation never writes into the "
            "checkpoint it vouches for: name a file outside it"
        )
    elif attest and (target := _not_regular(str(attest), f"{attest}.sig")):
        # the statement and any stale signature beside it (removed when a new one is written)
        problems.append(f"{spell('attest')} {target}")
    if key and not attest:
        problems.append(f"{spell('attest_key')} signs the attestation: give {spell('attest')} too")
    if key and not os.path.exists(str(key)):  # a FIFO or a folder: the bounded reader says which
        problems.append(f"{spell('attest_key')} {key}: no such file (an EC private key in PEM)")
    elif key and (why := key_problem(str(key))):
        problems.append(f"{spell('attest_key')}: {why}")
    return problems


def _not_regular(*paths: str) -> str | None:
    """The first of ``paths`` tpload would not write (a FIFO, a device, a symlink...), with why."""
    from ..storage.files import target_problem

    for path in paths:
        if why := target_problem(path):
            return f"{path} {why}"
    return None


def not_a_folder(path: str) -> str | None:
    """Why ``path`` cannot be (or be made) a folder: it, or the nearest of its parents that exists,
    is not a folder; None if it can."""
    p = Path(os.path.abspath(path))
    for q in (p, *p.parents):
        if q.exists():
            return (
                None
                if q.is_dir()
                else (
                    f"{q} is not a folder"
                    if q == p
                    else f"{q} is a file, so the folder cannot be made"
                )
            )
        if q.is_symlink():
            return f"{q} is a broken symlink"
    return None


def _signer_problems(values: Mapping[str, object], spell: Spell) -> list[str]:
    """One way to check a signature at a time, each complete (verification/signing.py uses it)."""
    given = {
        k
        for k in ("signer_key", "signer_cert", "signer_chain", "signer_identity", "signer_issuer")
        if values.get(k)
    }
    ways = [
        w
        for w, keys in (
            ("a key", {"signer_key"}),
            ("a certificate", {"signer_cert", "signer_chain"}),
            ("a sigstore identity", {"signer_identity", "signer_issuer"}),
        )
        if given & keys
    ]
    if len(ways) > 1:
        return [
            (
                f"{spell('signer_key')}, {spell('signer_chain')} and "
                f"{spell('signer_identity')} are three ways to check a signature; give one (got "
                f"{' and '.join(ways)})"
            )
        ]
    pairs = (
        ("signer_cert", "signer_chain"),
        ("signer_identity", "signer_issuer"),
        ("signer_issuer", "signer_identity"),
    )
    return [f"{spell(a)} needs {spell(b)}" for a, b in pairs if a in given and b not in given]


SIGNING_INSTALL = "pip install -e '.[signing]' in tpload's clone (model-signing and pyopenssl)"


def signing_missing() -> str | None:
    """Why attestations cannot be signed or their signatures checked here (None: they can): the
    ``attest_key`` rule's first question, and attest/signing.py's."""
    try:
        import model_signing  # noqa: F401  # only probing that the optional extra is installed
    except (
        ImportError
    ) as e:  # model-signing 1.1.1 also imports OpenSSL (pyopenssl) without declaring it
        return (
            f"signing needs model-signing, which is not importable ({e.name or e}); "
            f"{SIGNING_INSTALL}"
        )
    return None


def key_problem(key: str | os.PathLike[str]) -> str | None:
    """Why ``key`` cannot sign an attestation (None: it is an unencrypted EC private key in PEM),
    read once by the bounded reader (a FIFO, a device or a huge file is refused by name)."""
    why = signing_missing()
    if why:
        return why
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from ..storage.files import read_pem

    try:
        loaded = load_pem_private_key(read_pem(key, "--attest-key"), password=None)
    except LoadError as e:  # not a regular file, too big, unreadable: the bounded reader says which
        return str(e)
    except (ValueError, TypeError) as e:  # not PEM, or encrypted
        return f"{escape_name(key)}: not an unencrypted private key in PEM ({first_line(e)})"
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        return (
            f"{escape_name(key)}: a {type(loaded).__name__}, not an elliptic-curve private key "
            "(model-signing's key method)"
        )
    return None
