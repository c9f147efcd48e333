SELECT job_runs.params, job_runs.job_id, job_runs.task_name, job_runs.concurrency_key, job_runs.state, job_runs.outcome, job_runs.attempts, job_runs.max_attempts, job_runs.rescues, job_runs.heartbeat_at, job_runs.last_error, job_runs.next_retry_at, job_runs.created_at, job_runs.started_at, job_runs.finished_at, job_runs.updated_at, job_runs.worker, job_runs.claim_token, job_runs.queue, job_runs.result, job_runs.expires_at, job_runs.cancel_requested_at, job_runs.workflow_id, job_runs.key_limit, job_runs.enqueued_by, job_runs.attempted_at, job_runs.priority, job_runs.time_limit, job_runs.soft_time_limit 
FROM job_runs 
WHERE job_runs.state = ? AND job_runs.heartbeat_at < ? AND (job_runs.job_id NOT IN (__[POSTCOMPILE_job_id_1])) ORDER BY job_runs.heartbeat_at
 LIMIT ? OFFSET ?;
