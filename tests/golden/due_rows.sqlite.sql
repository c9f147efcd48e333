SELECT outbox.id, outbox.module, outbox.job_id, outbox.attempt, outbox.task_name, outbox.body, outbox.created_at, outbox.available_at, outbox.published_at, outbox.publish_count, outbox.delivered_at, outbox.publish_failures, outbox.last_error, outbox.dead_at, outbox.queue, outbox.priority 
FROM outbox 
WHERE NOT (EXISTS (SELECT flow_pauses.name 
FROM flow_pauses 
WHERE flow_pauses.kind = ? AND flow_pauses.name = outbox.module OR flow_pauses.kind = ? AND flow_pauses.name = coalesce(outbox.queue, ?))) AND outbox.published_at IS NULL AND outbox.dead_at IS NULL AND outbox.available_at <= ? ORDER BY outbox.priority DESC, outbox.available_at, outbox.id
 LIMIT ? OFFSET ?;
