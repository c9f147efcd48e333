WITH RECURSIVE levels(module, q, priority) AS 
(SELECT head.module AS module, coalesce(head.queue, '') AS q, head.priority AS priority 
FROM outbox AS head 
WHERE head.id = (SELECT next_level.id 
FROM outbox AS next_level 
WHERE next_level.published_at IS NULL AND next_level.dead_at IS NULL ORDER BY next_level.module, coalesce(next_level.queue, ''), next_level.priority 
 LIMIT %(param_1)s) UNION ALL SELECT head.module AS module, coalesce(head.queue, '') AS q, head.priority AS priority 
FROM levels AS seen JOIN outbox AS head ON head.id = (SELECT next_level.id 
FROM outbox AS next_level 
WHERE next_level.published_at IS NULL AND next_level.dead_at IS NULL AND (next_level.module, coalesce(next_level.queue, ''), next_level.priority) > (seen.module, seen.q, seen.priority) ORDER BY next_level.module, coalesce(next_level.queue, ''), next_level.priority 
 LIMIT %(param_2)s))
 SELECT due_of_level.id 
FROM (SELECT levels.module AS module, levels.q AS q, levels.priority AS priority 
FROM levels 
WHERE NOT (EXISTS (SELECT flow_pauses.name 
FROM flow_pauses 
WHERE flow_pauses.kind = %(kind_1)s AND flow_pauses.name = levels.module OR flow_pauses.kind = %(kind_2)s AND flow_pauses.name = coalesce(nullif(levels.q, ''), %(coalesce_1)s)))) AS open_levels JOIN LATERAL (SELECT due_row.id AS id, due_row.priority AS priority, due_row.available_at AS available_at 
FROM outbox AS due_row 
WHERE due_row.module = open_levels.module AND coalesce(due_row.queue, '') = open_levels.q AND due_row.priority = open_levels.priority AND due_row.published_at IS NULL AND due_row.dead_at IS NULL AND due_row.available_at <= %(available_at_1)s ORDER BY due_row.available_at, due_row.id 
 LIMIT %(param_3)s) AS due_of_level ON true ORDER BY due_of_level.priority DESC, due_of_level.available_at, due_of_level.id 
 LIMIT %(param_4)s;
