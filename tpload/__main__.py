"""``python -m tpload``: the command line (:mod:`tpload.cli`), after the one check that
must come first."""

from __future__ import annotations

import os
import sys


def _refuse_a_shadowing_folder() -> None:
    """``python -m tpload`` puts the current folder first on the path: run from the folder that
    holds a clone, its ``tpload/`` (the clone, with no ``__init__.py``) becomes an empty namespace
    package that hides the installed one, and every import from it fails. Say so in one line."""
    package = sys.modules.get(__package__ or "tpload")
    if package is not None and getattr(package, "__file__", None) is None:
        where = (
            ", ".join(dict.fromkeys(map(os.path.abspath, getattr(package, "__path__", [])))) or "?"
        )
        sys.exit(
            f"tpload: error: the folder {where} hides the installed tpload: Python imports it "
            "(from the current folder) as an empty package, since it holds the source rather "
            "than being it (a clone?). Run from another folder, or from inside the clone to use "
            "its source"
        )


_refuse_a_shadowing_folder()  # before the imports below: they are what fails in a shadowed tpload

try:
    from .cli import main  # noqa: E402  after the shadowing check
except KeyboardInterrupt:  # Ctrl-C in the first moment: 130 as at any later phase, no traceback
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
