"""Celery settings jobsapp's lifecycle contract depends on; each says why it is set.

Broker URL and transport folders come from ``jobsapp.settings`` (environment variables,
embedded defaults under ./var/), applied in ``jobsapp.celery_app``.
"""

from datetime import timedelta

# Ack after the body, so a worker that dies mid-run leaves the message to be redelivered;
# the journal's claim guard turns a redelivery of finished work into a no-op.
task_acks_late = True
# A child killed by the OS (OOM, SIGKILL) must not count as done: reject, redeliver.
task_reject_on_worker_lost = True
# One message at a time per process: a long job never sits on a second prefetched one.
worker_prefetch_multiplier = 1
# On a lost broker connection, cancel running late-ack tasks: their messages will be
# redelivered anyway, and the heartbeat fence stops a duplicate from publishing.
worker_cancel_long_running_tasks_on_connection_loss = True
# Workers and beat wait for the broker at start instead of crashing under a supervisor.
broker_connection_retry_on_startup = True
# Every delivery is checked before Celery's consumer reads it: a message with bad headers
# or an unusable body is rejected once and logged, never fatal
# (jobsapp.lifecycle.transport.guard).
worker_consumer = "jobsapp.lifecycle.transport.guard:GuardedConsumer"
# Flower needs task events and sent events.
worker_send_task_events = True
task_send_sent_event = True
# The journal is the result store: Celery's result backend reads the run rows
# (jobsapp.lifecycle.celery_api.backend), so AsyncResult(id) works from any process. Tasks
# store nothing after they run (the journal already holds it); update_state still reaches it.
result_backend = "jobsapp.lifecycle.celery_api.backend:JournalBackend"
task_ignore_result = True
# Job messages are JSON validated against jobs.schema.json; never pickle.
task_serializer = "json"
accept_content = ["json"]
# The longest a job may run; the broker's redelivery timeout must exceed it.
task_time_limit = 3600
# No global soft limit: Celery's pool arms a hard limit only after the soft one, so a
# global soft limit above a task's own time_limit would delay that task's kill to it.
# Redis redelivers an unacked message after visibility_timeout; it must exceed the
# longest run or a healthy long job would be delivered twice.
VISIBILITY_TIMEOUT = 2 * task_time_limit
# RabbitMQ: publish returns only after the broker confirms (the outbox marks after it).
# Redis: one list per priority 0-9 (kombu's default buckets them by 4), so every level of
# ``priority`` is served apart (docs/flow-control.md, "Priorities").
broker_transport_options = {
    "visibility_timeout": VISIBILITY_TIMEOUT,
    "confirm_publish": True,
    "priority_steps": list(range(10)),
}
# RabbitMQ orders a queue by priority only if it was declared with x-max-priority: a
# deployment sets ``task_queue_max_priority = 9`` for that. Not set here: RabbitMQ refuses
# to redeclare an existing queue with another argument, so it would stop every worker of
# a deployment whose queues exist (docs/flow-control.md, "Priorities").
worker_hijack_root_logger = False
worker_redirect_stdouts = False

# Beat: the singleton home of maintenance. Cadences; each pass is bounded per tick.
beat_scheduler = "jobsapp.maintenance.scheduler:LeasedScheduler"
beat_max_loop_interval = 1
beat_schedule = {
    "reaper": {"task": "jobsapp.maintenance.reaper", "schedule": timedelta(seconds=15)},
    "outbox-relay": {"task": "jobsapp.maintenance.relay", "schedule": timedelta(seconds=2)},
    "retention": {"task": "jobsapp.maintenance.retention", "schedule": timedelta(minutes=10)},
    # /metrics counters and histograms move at this pace (see jobsapp.monitor.rollup).
    "metrics-rollup": {"task": "jobsapp.maintenance.metrics", "schedule": timedelta(seconds=15)},
    # Staging retention: its windows are a day (orphans) and a week (failed uploads), so
    # ten minutes is precise enough, and each tick lists a bounded number of objects.
    "staging-retention": {
        "task": "jobsapp.maintenance.staging",
        "schedule": timedelta(minutes=10),
    },
    # Reconcile: failures are taken again only after a cool-down of minutes, so a coarse
    # cadence loses nothing; each domain's pass is one bounded batch.
    "reconcile": {"task": "jobsapp.maintenance.reconcile", "schedule": timedelta(minutes=5)},
}
