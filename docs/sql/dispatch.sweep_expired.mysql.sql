-- dispatch.sweep_expired (mysql)
-- Expired leases become `unknown`, never a blind resend. Safe to run from every replica: rows
-- another sweeper holds are skipped, and a swept row no longer matches.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.lease_expires_at < :lease_expires_at_1 ORDER BY outbox_messages.lease_expires_at, outbox_messages.id
 LIMIT :param_1;

-- step 2
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages FORCE INDEX (PRIMARY)
WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('processing') AND outbox_messages.lease_expires_at < :lease_expires_at_1 ORDER BY outbox_messages.id FOR UPDATE SKIP LOCKED;

-- step 3
UPDATE outbox_messages SET status='unknown', attempt_count=(outbox_messages.attempt_count + :attempt_count_1), updated_at=:updated_at, claim_token=:claim_token, lease_expires_at=:lease_expires_at, last_error=:last_error WHERE outbox_messages.id IN (:id_1_1);

-- step 4
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1_1);

-- step 5
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 6
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1_1) AND hook_endpoints.enabled = true;
