"""What every suite shares: its options, the shape of its result, and how to time a loop."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Options:
    """One run's settings; `quick` trades precision for time (CI runs it on 2 cores)."""

    out_dir: Path = Path("runs/bench")
    quick: bool = False
    threads: int = 1  # torch threads per process, the same for every variant
    micro_batch_size: int = 32
    nproc: int | None = None  # ranks for multi-rank suites (default: local devices, or 2)
    predict_params: int = 7_500_000_000  # the memory suite's predictor table (the paper's example)
    predict_world_size: int = 64

    def pick(self, quick_value, full_value):
        return quick_value if self.quick else full_value

    @property
    def ranks(self) -> int:
        if self.nproc:
            return self.nproc
        from scaledl.hpc.launchers import local_device_count

        return local_device_count()


def headline(name: str, value: float, target: str | None = None, met: bool | None = None,
             ci: tuple[float, float] | None = None, text: str | None = None) -> dict:
    """The one number a suite is judged by, and how it reads on the table's last line."""
    interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
    goal = f" (target {target}: {'met' if met else 'missed'})" if target and met is not None else ""
    return {"name": name, "value": value, "ci": list(ci) if ci else None, "target": target, "met": met,
            "text": text or f"{name} = {value:.3f}{interval}{goal}"}


def result(suite: str, title: str, columns: list[str], rows: list[dict], headline_: dict, **extra) -> dict:
    return {"suite": suite, "title": title, "columns": columns, "rows": rows, "headline": headline_, **extra}


def rounded(value, digits: int = 4):
    """A float rounded to `digits` significant digits (JSON and tables stay readable)."""
    if value is None or not isinstance(value, float) or not math.isfinite(value) or value == 0:
        return value
    return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))
