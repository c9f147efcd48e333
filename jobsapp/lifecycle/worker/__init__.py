"""The worker's side of an attempt: the claim of a delivered message (claim.py), the
attempt's run and outcome (attempt.py), the body's view of its run (context.py), the
heartbeat thread (heartbeat.py), time limits (timeouts.py), a limited key's slot let go
at the outcome (key_limits.py), what Flower sees (celery_view.py), and the pools'
setup (pools.py)."""
