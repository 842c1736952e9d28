import time

import pytest

from scaledl import Stopwatch


def test_warmup_laps_are_dropped():
    watch = Stopwatch("cpu", warmup=2)
    for seconds in (0.05, 0.05, 0.01, 0.01, 0.01):
        watch.start()
        time.sleep(seconds)
        watch.stop()
    assert len(watch.laps) == 3
    assert watch.median == pytest.approx(0.01, abs=0.008)
    assert watch.total < 0.08


def test_stop_without_start_is_an_error():
    with pytest.raises(RuntimeError, match="before start"):
        Stopwatch().stop()
