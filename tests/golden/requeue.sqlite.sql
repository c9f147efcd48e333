UPDATE job_runs SET state=?, max_attempts=(job_runs.max_attempts + ?), heartbeat_at=?, last_error=?, next_retry_at=?, updated_at=? WHERE job_runs.job_id = ? AND (job_runs.state || '') = ? AND job_runs.attempts = ? AND job_runs.claim_token = ? AND job_runs.cancel_requested_at IS NULL RETURNING params, job_id, task_name, concurrency_key, state, outcome, attempts, max_attempts, rescues, heartbeat_at, last_error, next_retry_at, created_at, started_at, finished_at, updated_at, worker, claim_token, queue, result, expires_at, cancel_requested_at, workflow_id, key_limit, enqueued_by, attempted_at, priority, time_limit, soft_time_limit;

INSERT INTO job_events (module, job_id, attempt, transition, from_state, to_state, actor, reason, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

INSERT INTO outbox (module, job_id, attempt, task_name, body, created_at, available_at, queue, priority) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id;
