"""MLflow's system metrics (``system/...``: CPU utilisation, memory, disk, network, GPU memory and utilisation where a
GPU is present) in every training run, whatever its engine, shown in the MLflow UI's "System metrics" tab.

MLflow's own monitor is a thread that writes to the store by itself, unbounded and unretried, beside the run's
writes; under a fault of the store (a server gone, a locked SQLite file) its warnings and waits would break the
one-line behaviour of every command. So the sampling is MLflow's (its CPU, disk, network and GPU monitors, psutil and
NVML underneath) and the writing is the run's: :meth:`SystemMetrics.due` is taken into :meth:`RunLogger.log`'s
buffer with the step's metrics, at most once per ``$POBENCH_SYSTEM_METRICS_S`` seconds (default 10; ``0``: off) and at
the run's first step, then sent with the run's other metrics (checkpointed, retried, resumed like them).
"""

from __future__ import annotations

import math
import os
import time

ENV = "POBENCH_SYSTEM_METRICS_S"
DEFAULT_INTERVAL_S = 10.0
PREFIX = "system/"


def interval_s() -> float:
    """Seconds between two samples (``$POBENCH_SYSTEM_METRICS_S``; 0 turns them off); a bad value is one line."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"${ENV}={raw!r}: give the seconds between two system-metrics samples (>= 0; 0: off)")
    return value


class SystemMetrics:
    """Samples of the machine the run trains on, in MLflow's names under ``system/``."""

    def __init__(self, interval: float | None = None) -> None:
        self.interval = interval_s() if interval is None else interval
        self.monitors: list = []
        self.last: float | None = None
        if self.interval > 0:
            self.monitors = _monitors()
            for m in self.monitors:  # (the first CPU sample primes psutil's counter: utilisation since then)
                m.collect_metrics()
                m.clear_metrics()

    def due(self) -> dict[str, float]:
        """The metrics of one sample when one is due (the first call, then every ``interval`` seconds), else {}."""
        now = time.monotonic()
        if not self.monitors or (self.last is not None and now - self.last < self.interval):
            return {}
        self.last = now
        out: dict[str, float] = {}
        for m in self.monitors:
            try:
                m.collect_metrics()
                out.update({PREFIX + k: float(v) for k, v in m.aggregate_metrics().items()})
            except Exception:  # noqa: BLE001  (a sensor that fails once is left out of this sample, not the run)
                pass
            finally:
                m.clear_metrics()
        return {k: v for k, v in out.items() if math.isfinite(v)}


def _monitors() -> list:
    """MLflow's monitors of this machine: CPU and memory, disk, network, and the GPUs (NVML when installed, else
    torch's view of CUDA memory)."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    monitors: list = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    try:
        from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

        monitors.append(GPUMonitor())
    except Exception:  # noqa: BLE001  (no NVML: torch's CUDA memory, when there is a GPU)
        gpu = _TorchGPU.found()
        if gpu is not None:
            monitors.append(gpu)
    return monitors


class _TorchGPU:
    """GPU memory as torch's CUDA allocator sees it, in MLflow's names (``gpu_<i>_memory_usage_megabytes``), where
    NVML (``nvidia-ml-py``) is not installed."""

    def __init__(self, count: int) -> None:
        self.count, self._metrics = count, {}

    @classmethod
    def found(cls) -> _TorchGPU | None:
        import torch

        return cls(torch.cuda.device_count()) if torch.cuda.is_available() else None

    def collect_metrics(self) -> None:
        import torch

        for i in range(self.count):
            self._metrics[f"gpu_{i}_memory_usage_megabytes"] = torch.cuda.memory_reserved(i) / 2**20

    def aggregate_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def clear_metrics(self) -> None:
        self._metrics = {}
