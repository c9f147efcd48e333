WITH changed AS 
(UPDATE job_runs SET state=%(r_state)s, outcome=%(r_outcome)s, last_error=%(r_last_error)s, next_retry_at=%(param_1)s, finished_at=coalesce(%(r_now)s, now()), updated_at=coalesce(%(r_now)s, now()), result=%(r_result)s::JSON WHERE job_runs.job_id = %(r_job_id)s::UUID AND (job_runs.state || '') = %(param_2)s AND job_runs.attempts = %(r_attempts)s AND job_runs.claim_token = %(r_claim_token)s::UUID AND job_runs.cancel_requested_at IS NULL RETURNING job_runs.job_id, job_runs.updated_at, job_runs.attempts, job_runs.attempted_at, job_runs.worker, job_runs.workflow_id), 
ev AS 
(INSERT INTO job_events (module, job_id, attempt, transition, from_state, to_state, actor, reason, at, detail) SELECT %(e_module)s AS module, changed.job_id AS job_id, %(e_attempt)s AS attempt, %(e_transition)s AS transition, %(e_from_state)s AS from_state, %(e_to_state)s AS to_state, %(e_actor)s AS actor, %(e_reason)s AS reason, changed.updated_at AS at, %(e_detail)s::JSON AS detail 
FROM changed 
WHERE changed.attempted_at IS NULL)
 SELECT changed.job_id, changed.updated_at, changed.attempts, changed.attempted_at, changed.worker, changed.workflow_id 
FROM changed;
