-- stats.oldest_unknown (postgresql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.to_address, outbox_messages.updated_at, outbox_messages.claimed_by
FROM outbox_messages
WHERE outbox_messages.status = :status_1::VARCHAR ORDER BY outbox_messages.updated_at
 LIMIT :param_1::INTEGER;
