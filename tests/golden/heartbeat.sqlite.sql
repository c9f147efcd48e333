UPDATE job_runs SET heartbeat_at=? WHERE job_runs.job_id = ? AND (job_runs.state || '') = ? AND job_runs.attempts = ? AND job_runs.claim_token = ? AND job_runs.cancel_requested_at IS NULL;
