UPDATE job_runs SET state=?, outcome=?, last_error=?, next_retry_at=?, finished_at=?, updated_at=?, result=? WHERE job_runs.job_id = ? AND (job_runs.state || '') = ? AND job_runs.attempts = ? AND job_runs.claim_token = ? AND job_runs.cancel_requested_at IS NULL RETURNING job_id, updated_at, attempts, attempted_at, worker, workflow_id;

INSERT INTO job_events (module, job_id, attempt, transition, from_state, to_state, actor, reason, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
