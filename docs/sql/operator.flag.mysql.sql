-- operator.flag (mysql)
-- Mark an unknown message as waiting for an operator, once per stay in `unknown`.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('unknown') AND outbox_messages.id = :id_1 AND NOT (EXISTS (SELECT *
FROM message_events
WHERE message_events.message_id = outbox_messages.id AND message_events.from_status = :from_status_1 AND message_events.to_status = :to_status_1 AND message_events.at >= outbox_messages.updated_at)) FOR UPDATE;

-- step 2
UPDATE outbox_messages SET status='unknown', updated_at=:updated_at WHERE outbox_messages.id IN (:id_1_1);

-- step 3
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1_1);

-- step 4
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)
