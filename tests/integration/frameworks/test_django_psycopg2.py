"""The Django tests again, with Django on psycopg2.

Django prefers psycopg 3 when it is installed, and the dev install has it (the bench's
extra), so the suite's own run covers the psycopg 3 bridge. jobsapp itself depends on
psycopg2 only, which is what a Django project gets when nothing else brings psycopg 3: this
runs test_django_example.py in a child pytest where psycopg 3 cannot be imported.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.procs import ROOT

pytestmark = pytest.mark.timeout(240)

CHILD = """
import sys
sys.modules["psycopg"] = None  # an import of psycopg 3 now fails, as if it were absent
from django.db.backends.postgresql.psycopg_any import is_psycopg3
assert not is_psycopg3
import pytest
sys.exit(pytest.main(["-q", "tests/integration/frameworks/test_django_example.py"]))
"""


def test_django_example_passes_on_psycopg2() -> None:
    # The child names its own database, queue and counters: only the services are shared.
    ours = ("JOBSAPP_", "DJANGO_")
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("JOBSAPP_TEST_") or not k.startswith(ours)
    }
    env.pop("JOBSAPP_TEST_NAMESPACE", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout
    assert "skipped" not in done.stdout
