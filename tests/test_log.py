import subprocess
import sys

from scaledl import progress

SCRIPT = "import scaledl; log = scaledl.get_logger({rank}); log.info('hello'); log.warning('careful')"


def run_as(rank, **env):
    import os

    result = subprocess.run([sys.executable, "-c", SCRIPT.format(rank=rank)], capture_output=True, text=True,
                            env={**os.environ, **env}, check=True)
    return result.stdout.splitlines()


def test_main_rank_speaks_and_says_who_it_is():
    lines = run_as(0)
    assert len(lines) == 2 and lines[0].startswith("[rank0] ") and lines[0].endswith("INFO hello")


def test_other_ranks_only_warn_unless_asked():
    assert [line.split(" ", 2)[2] for line in run_as(3)] == ["WARNING careful"]
    assert len(run_as(3, SCALEDL_LOG_ALL_RANKS="1")) == 2


def test_progress_bar_only_on_the_main_rank():
    items = [1, 2, 3]
    assert progress(items, is_main=False) is items
    bar = progress(items, is_main=True, disable=True)
    assert list(bar) == items and bar is not items
