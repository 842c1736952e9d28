"""No step waits on the host: the non-finite guard keeps its verdict on the device under `stop` and
reads it with the metrics, so a run of 30 steps reads values on the host as often as one of 10
(tests/probes/host_read_probe.py counts every read in a real run).  `skip` must read every step."""
import sys

import pytest

from conftest import PROBES, reports, run

FLAGS = ["--epochs", "1", "--train-limit", "2048", "--batch-size", "32", "--log-interval", "1000"]


def reads(tmp_path, steps: int, *options) -> int:
    out = tmp_path / f"{steps}{''.join(options)}"
    command = [sys.executable, str(PROBES / "host_read_probe.py"), *FLAGS, "--max-steps", str(steps), *options,
               "--out-dir", str(out)]
    return reports(run(command, timeout=300, nproc=1).stdout)[0]["reads"]


@pytest.mark.slow
def test_a_step_reads_nothing_on_the_host_unless_it_must_skip(tmp_path):
    assert reads(tmp_path, 30) == reads(tmp_path, 10)  # 20 more steps, not one more read
    skipping = reads(tmp_path, 30, "--on-nonfinite", "skip") - reads(tmp_path, 10, "--on-nonfinite", "skip")
    assert skipping == 20  # the control: skip reads its verdict once a step
