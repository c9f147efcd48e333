"""PNG figures for the benchmarks (matplotlib without a display)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def saved(path: Path, columns: int = 1, size: tuple[float, float] = (7, 4)) -> Iterator[Any]:
    """Yields the axes of a new figure (a list when ``columns`` > 1), then writes it to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, columns, figsize=size)
    try:
        yield axes
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
