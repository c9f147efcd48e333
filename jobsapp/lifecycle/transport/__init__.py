"""Between the journal and the broker: the transactional outbox's publish after commit
(outbox.py), the broker publishers (publisher.py, batch_send.py, the Redis and AMQP
transports), the marks of what was published (marker.py), the checks of a received
message before it runs (envelope.py, guard.py), and the trace a message carries
(tracing.py)."""
