-- operator.flag (sqlite)
-- Mark an unknown message as waiting for an operator, once per stay in `unknown`.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('unknown') AND outbox_messages.id = :id_1 AND NOT (EXISTS (SELECT *
FROM message_events
WHERE message_events.message_id = outbox_messages.id AND message_events.from_status = :from_status_1 AND message_events.to_status = :to_status_1 AND message_events.at >= outbox_messages.updated_at));

-- step 2
UPDATE outbox_messages SET status='unknown', updated_at=:updated_at WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('unknown') AND outbox_messages.id = :id_2 AND NOT (EXISTS (SELECT *
FROM message_events
WHERE message_events.message_id = outbox_messages.id AND message_events.from_status = :from_status_1 AND message_events.to_status = :to_status_1 AND message_events.at >= outbox_messages.updated_at)) RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name, template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at, created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider, provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority, claim_order_at, attachment_count;

-- step 3
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)
