"""The one build step pyproject.toml cannot declare: the card keeps ``migrations/`` and
``celeryconfig.py`` at the top level of the repository, and the wheel carries them inside
the package (``jobsapp/migrations``, ``jobsapp/celeryconfig.py``), where ``jobsapp.shipped``
finds them in an installation, in any working directory. Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

TOP_LEVEL = (
    "celeryconfig.py",
    "migrations/env.py",
    "migrations/script.py.mako",
    "migrations/versions/*.py",
)


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        package = Path(self.build_lib, "jobsapp")
        for source in sorted(p for pattern in TOP_LEVEL for p in Path().glob(pattern)):
            self.mkpath(str((package / source).parent))
            self.copy_file(str(source), str(package / source))


setup(cmdclass={"build_py": BuildPy})
