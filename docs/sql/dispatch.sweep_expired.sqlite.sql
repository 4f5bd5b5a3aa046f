-- dispatch.sweep_expired (sqlite)
-- Expired leases become `unknown`, never a blind resend. Safe to run from every replica: rows
-- another sweeper holds are skipped, and a swept row no longer matches.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.lease_expires_at < :lease_expires_at_1 ORDER BY outbox_messages.lease_expires_at, outbox_messages.id
 LIMIT :param_1 OFFSET :param_2;

-- step 2
UPDATE outbox_messages SET status='unknown', attempt_count=(outbox_messages.attempt_count + :attempt_count_1), updated_at=:updated_at, claim_token=:claim_token, lease_expires_at=:lease_expires_at, last_error=:last_error WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('processing') AND outbox_messages.lease_expires_at < :lease_expires_at_1 RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name, template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at, created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider, provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority, claim_order_at, attachment_count;

-- step 3
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 4
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1_1) AND hook_endpoints.enabled = 1;
