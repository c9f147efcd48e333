"""``python -m examples.django_app.manage migrate`` (from the repository root)."""

import os
import sys

from django.core.management import execute_from_command_line

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    execute_from_command_line(sys.argv)
