"""The producer's side of ``.delay()``/``apply_async``: the call made a new job
(newjob.py), its enqueue in the journal and publish after commit (enqueue.py), and the
Redis fast path in front of the idempotency window (dedup.py)."""
