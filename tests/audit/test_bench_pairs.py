"""The statistics ``bench.audit`` states the chain's cost with (issue 26,
2026-12-07): the 95 % interval of the median of the per-round on-minus-off
pairs and the verdict against 5 us drawn from it. A wrong rank in the
interval would call a bound shown that the noise does not support."""

from __future__ import annotations

import random

from bench.audit import median_interval, paired, verdict


def test_the_median_interval_takes_the_binomial_ranks() -> None:
    # the published ranks of the distribution-free 95 % interval of a median (Conover,
    # Practical Nonparametric Statistics, table A3): n = 6 -> 1 and 6, 40 -> 14 and 27,
    # 100 -> 40 and 61 (1-based)
    for n, low, high in ((6, 1, 6), (20, 6, 15), (40, 14, 27), (100, 40, 61)):
        assert median_interval([float(i) for i in range(1, n + 1)]) == (low, high), n
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) == (float("-inf"), float("inf"))  # too few


def test_the_interval_covers_the_median_as_often_as_it_says() -> None:
    """Skewed noise (what load does to a timing): the interval holds the true
    median in about 95 % of samples, not fewer."""
    rng = random.Random(26)
    true_median = 3.0 + 2.0 * 0.6931471805599453  # of 3 + Exp(mean 2)
    trials, held = 2000, 0
    for _ in range(trials):
        low, high = median_interval([3.0 + rng.expovariate(0.5) for _ in range(40)])
        held += low <= true_median <= high
    assert 0.94 <= held / trials <= 0.99


def test_the_verdict_needs_the_whole_interval_on_one_side() -> None:
    assert verdict([4.0 + i / 100 for i in range(40)]).endswith("shown")  # all within 4.00-4.39
    # ranks 14 and 27 of 40: 4.8 and 6.1 span 5; 3.3 and 4.6 do not, though a quarter of the pairs is over 5
    assert verdict([3.5 + i / 10 for i in range(40)]).endswith("spans it)")
    assert verdict([2.0 + i / 10 for i in range(40)]).endswith("shown")
    assert verdict([4.0 + i / 10 for i in range(40)]).endswith("exceeded")  # 5.3 and 6.6
    assert verdict([5.5 + i / 100 for i in range(40)]).endswith("exceeded")
    assert "IQR" in paired([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def test_the_verdict_names_its_unit() -> None:
    """bench.encryption judges per cent of runs/s lost as well as microseconds a step."""
    assert verdict([1.0 + i / 100 for i in range(40)], 5.0, "%") == "<= 5 %: shown"
    assert verdict([1.0 + i / 100 for i in range(40)], 5.0) == "<= 5 us: shown"
