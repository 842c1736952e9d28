"""The few statistics the benchmarks report: medians, percentiles, bootstrap intervals.

Step times are skewed (a rare slow step from the OS or a collective's retry), so every
suite reports medians with percentiles, and the confidence interval of a ratio comes from
resampling, which assumes no distribution.  `converged` is how a suite decides how many
rounds to run: it keeps going until the interval of its ratio is as narrow as asked.
"""
from __future__ import annotations

import numpy as np

CONFIDENCE = 0.95


def summary(samples) -> dict:
    """Median, 10th/90th percentiles and the count of a list of step times (or rates)."""
    values = np.asarray(samples, dtype=np.float64)
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return {"median": float(median), "p10": float(p10), "p90": float(p90), "n": int(values.size)}


def bootstrap_ci(samples, statistic=np.median, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of `statistic` over `samples`."""
    values = np.asarray(samples, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(resamples, values.size))
    estimates = np.apply_along_axis(statistic, 1, values[picks])
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(estimates, [tail, 100 - tail])
    return float(low), float(high)


def ratio_of_medians(numerator, denominator, resamples: int = 2000, seed: int = 0) -> dict:
    """median(numerator) / median(denominator) with a bootstrap interval (each side resampled)."""
    a, b = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
    rng = np.random.default_rng(seed)
    a_medians = np.median(a[rng.integers(0, a.size, (resamples, a.size))], axis=1)
    b_medians = np.median(b[rng.integers(0, b.size, (resamples, b.size))], axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(a_medians / b_medians, [tail, 100 - tail])
    return {"ratio": float(np.median(a) / np.median(b)), "ci_low": float(low), "ci_high": float(high)}


def median_ratio(ratios, resamples: int = 2000, seed: int = 0) -> dict:
    """The median of per-round ratios with its bootstrap interval (one round: no interval)."""
    values = np.asarray(ratios, np.float64)
    if values.size < 2:
        value = float(values[0]) if values.size else float("nan")
        return {"ratio": value, "ci_low": value, "ci_high": value}
    low, high = bootstrap_ci(values, resamples=resamples, seed=seed)
    return {"ratio": float(np.median(values)), "ci_low": low, "ci_high": high}


def converged(interval: dict, tolerance: float) -> bool:
    """True when the interval's half-width is at most `tolerance` of its ratio."""
    half_width = (interval["ci_high"] - interval["ci_low"]) / 2
    return bool(np.isfinite(half_width) and half_width <= tolerance * abs(interval["ratio"]))


def fit_alpha_beta(sizes_bytes, seconds) -> dict:
    """Least-squares fit of t = alpha + beta * n (Hockney's latency-bandwidth model).

    Weighted by 1/t so that the small messages (which set alpha) count as much as the
    large ones (which set beta); returns alpha in seconds and the bandwidth 1/beta in B/s.
    A latency and a time per byte cannot be negative, but times taken on busy shared cores can
    pull a free fit below zero: then that term is held at 0 and the other fitted alone
    (`held_at_zero` names it; a beta of 0 is an infinite bandwidth: the sizes did not matter)."""
    n, t = np.asarray(sizes_bytes, np.float64), np.asarray(seconds, np.float64)
    weight = (1 / t) ** 2  # np.polyfit's w multiplies the residuals: their squares weigh 1/t^2
    beta, alpha = np.polyfit(n, t, 1, w=1 / t)
    held = None
    if beta < 0:
        alpha, beta, held = float(np.sum(weight * t) / np.sum(weight)), 0.0, "beta"
    elif alpha < 0:
        alpha, beta, held = 0.0, float(np.sum(weight * n * t) / np.sum(weight * n * n)), "alpha"
    return {"alpha_s": float(alpha), "beta_s_per_byte": float(beta),
            "bandwidth_Bps": float(1 / beta) if beta > 0 else float("inf"), "held_at_zero": held}
