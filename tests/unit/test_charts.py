"""The charts' percentiles from a histogram's bucket counts (pure)."""

from __future__ import annotations

from jobsapp.monitor.charts import ranks
from jobsapp.monitor.rollup import BUCKETS, INF


def test_each_percentile_is_the_upper_bound_of_the_bucket_it_falls_in() -> None:
    # 90 waits of at most 0.1 s, 9 of at most 5 s, 1 of at most 60 s.
    assert ranks({"0.1": 90, "5": 9, "60": 1}) == {50: 0.1, 95: 5.0, 99: 5.0}
    assert ranks({"0.1": 50, "60": 50}) == {50: 0.1, 95: 60.0, 99: 60.0}


def test_a_wait_past_the_last_bound_shows_that_bound_and_no_wait_shows_none() -> None:
    assert ranks({INF: 3}) == {50: BUCKETS[-1], 95: BUCKETS[-1], 99: BUCKETS[-1]}
    assert ranks({}) == {50: None, 95: None, 99: None}
