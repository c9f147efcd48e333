"""Celery's canvas on lifecycle tasks: chains, groups and chords compiled into the
journal's workflow steps (canvas.py), new-style errbacks (errback.py) and
``Task.replace`` (replacement.py). A task never called in a canvas never enters here."""
