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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config

PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str, marker: str) -> Path:
    """``marker`` is a file the packaged copy must hold: a checkout from before the move may
    still have an emptied ``jobsapp/migrations/__pycache__``."""
    inside = PACKAGE / name
    return inside if (PACKAGE / marker).is_file() else PACKAGE.parent / name


MIGRATIONS = _shipped("migrations", "migrations/env.py")
CELERYCONFIG = _shipped("celeryconfig.py", "celeryconfig.py")


def alembic_config() -> Config:
    """Alembic's settings, built here, so an installation needs no ini file: the migrations
    are the checkout's top-level folder or the wheel's packaged copy."""
    from alembic.config import Config  # only where migrations run: it loads Alembic

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg
