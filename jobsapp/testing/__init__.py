"""A testing kit for your own lifecycle tasks: ``pip install 'jobsapp[testing]'`` and use the
``jobsapp`` fixture (docs/testing.md)."""

from __future__ import annotations

from jobsapp.testing.kit import Kit, Run

__all__ = ["Kit", "Run"]
