SELECT outbox.id, outbox.module, outbox.job_id, outbox.attempt, outbox.task_name, outbox.body, outbox.created_at, outbox.available_at, outbox.published_at, outbox.publish_count, outbox.delivered_at, outbox.publish_failures, outbox.last_error, outbox.dead_at, outbox.queue, outbox.priority 
FROM outbox 
WHERE outbox.id IN (__[POSTCOMPILE_id_1]) AND coalesce(outbox.published_at, outbox.dead_at) IS NULL AND outbox.available_at <= %(available_at_1)s ORDER BY outbox.priority DESC, outbox.available_at, outbox.id 
 LIMIT %(param_1)s FOR UPDATE SKIP LOCKED;
