"""Flow control a claim or a publish passes through: paused queues and domains, global
rate limits (gating.py) and priorities (priorities.py). A task with no rate and nothing
paused takes the one-statement claim; the pauses are read once a second per process."""
