"""Peak host memory of a load, sampled on a thread (the kernel keeps no peak of anonymous
memory)."""

from __future__ import annotations

import threading
from types import TracebackType

import psutil
import torch


class MemoryPeaks:
    """Samples this process's RSS and anonymous memory (RSS less file-backed) every few
    milliseconds; anonymous memory is what a loader costs beyond the page cache."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.rss_peak = self.anon_peak = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpload-mem", daemon=True)

    def _sample(self) -> None:
        m = self._proc.memory_info()
        self.rss_peak = max(self.rss_peak, m.rss)
        self.anon_peak = max(self.anon_peak, m.rss - getattr(m, "shared", 0))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> MemoryPeaks:
        self._sample()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def device_peaks(device: torch.device) -> tuple[int | None, int | None]:
    """The caching allocator's peaks on a CUDA device (allocated, reserved); (None, None)
    elsewhere."""
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def reset_device_peaks(device: torch.device) -> None:
    """Start the allocator's peaks afresh for this load (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
