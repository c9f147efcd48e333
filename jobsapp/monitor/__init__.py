"""Read-only views of the journal for operators: the admin summary and Prometheus metrics."""
