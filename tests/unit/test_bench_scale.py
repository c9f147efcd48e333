"""The scale benchmark's pure parts: medians per point and the ratio lines it prints."""

from __future__ import annotations

from bench.bench_scale import Point, medians, ratio_lines


def _point(broker: str, workers: int, rate: float, ran: int = 10) -> Point:
    return Point(broker, workers, rate, ran, 10, 4, 2, {})


def test_the_ratio_is_each_worker_counts_median_over_one_workers() -> None:
    points = [
        _point("redis", 1, 50),
        _point("redis", 1, 70),
        _point("redis", 1, 60),
        _point("redis", 4, 150),
        _point("redis", 4, 90),
        _point("redis", 4, 120),
    ]
    assert medians(points) == {("redis", 1): 60, ("redis", 4): 120}
    assert ratio_lines(points, 10) == [
        "scale redis 4/1 workers throughput ratio: 2.00",
        "scale every job ran once (PgBouncer transaction pooling): True",
    ]


def test_a_job_run_twice_anywhere_is_reported() -> None:
    points = [_point("redis", 1, 50), _point("rabbitmq-quorum", 1, 40, ran=11)]
    assert ratio_lines(points, 10)[-1].endswith(": False")
