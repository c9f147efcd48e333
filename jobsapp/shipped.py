"""Where the files a deployment may read or edit are found: ``migrations/`` and ``celeryconfig.py``.

A checkout keeps them at the top level of the repository, beside ``jobsapp/`` (the layout
the README's card shows); the wheel carries them inside the package (``setup.py`` copies
them to ``jobsapp/migrations`` and ``jobsapp/celeryconfig.py``), so an installation
migrates and configures Celery from any folder without a checkout. The packaged copy is
looked for first: beside an installed package is site-packages, where a ``migrations``
folder would belong to somebody else.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str, marker: str) -> Path:
    """``marker`` is a file the packaged copy must hold: a checkout from before the move may
    still have an emptied ``jobsapp/migrations/__pycache__``."""
    inside = PACKAGE / name
    return inside if (PACKAGE / marker).is_file() else PACKAGE.parent / name


MIGRATIONS = _shipped("migrations", "migrations/env.py")
CELERYCONFIG = _shipped("celeryconfig.py", "celeryconfig.py")
