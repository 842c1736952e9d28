"""Rank-aware logging: every line says which rank wrote it; only the main rank speaks by default.

Set SCALEDL_LOG_ALL_RANKS=1 to hear every rank (useful when one rank misbehaves).
"""
from __future__ import annotations

import logging
import os
import sys

LOGGER_NAME = "scaledl"


def get_logger(rank: int = 0, level: int = logging.INFO) -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        logger.addHandler(handler)
        logger.propagate = False
    logger.handlers[0].setFormatter(
        logging.Formatter(f"[rank{rank}] %(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    everyone = os.environ.get("SCALEDL_LOG_ALL_RANKS", "0") not in ("", "0")
    # Other ranks still report warnings and errors: a problem on rank 3 must not be silent.
    logger.setLevel(level if rank == 0 or everyone else logging.WARNING)
    return logger


def progress(iterable, is_main: bool, **tqdm_kwargs):
    """A tqdm bar on the main rank only (N identical bars would interleave), the bare iterable elsewhere."""
    if not is_main:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, dynamic_ncols=True, **tqdm_kwargs)
