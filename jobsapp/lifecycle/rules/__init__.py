"""The lifecycle's rules, with no I/O: states and who moves a run out of each, the errors
a body or a caller meets, retry decisions, failure descriptions, result values, the
message's body, and the scrubbing of secrets. Everything else in the lifecycle stands on
these; they import nothing of it."""
