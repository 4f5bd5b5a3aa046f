-- dispatch.sweep_expired (postgresql)
-- Expired leases become `unknown`, never a blind resend. Safe to run from every replica: rows
-- another sweeper holds are skipped, and a swept row no longer matches.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH locked AS
(SELECT outbox_messages.id AS id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.lease_expires_at < :lease_expires_at_1::TIMESTAMP WITH TIME ZONE ORDER BY outbox_messages.lease_expires_at, outbox_messages.id
 LIMIT :param_9::INTEGER FOR UPDATE SKIP LOCKED),
updated AS
(UPDATE outbox_messages SET status='unknown', attempt_count=(outbox_messages.attempt_count + :attempt_count_2::INTEGER), updated_at=:param_5::TIMESTAMP WITH TIME ZONE, claim_token=:param_6::UUID, lease_expires_at=:param_7::TIMESTAMP WITH TIME ZONE, last_error=:param_8::VARCHAR FROM locked WHERE outbox_messages.id = locked.id RETURNING outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count, locked.previous_state),
logged AS
(INSERT INTO message_events (message_id, from_status, to_status, at, actor, detail, provider_message_id, attempt) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.status AS status, :param_1::TIMESTAMP WITH TIME ZONE AS anon_1, :param_2::VARCHAR AS anon_2, substr(:param_3::VARCHAR || coalesce(updated.claimed_by, :coalesce_1::VARCHAR) || :param_4::VARCHAR, :substr_2::INTEGER, :substr_3::INTEGER) AS substr_1, updated.provider_message_id AS provider_message_id, updated.attempt_count + :attempt_count_1::INTEGER AS anon_3
FROM updated)
 SELECT updated.id, updated.tenant_id, updated.idempotency_key, updated.to_address, updated.to_name, updated.from_address, updated.subject, updated.template_name, updated.template_data, updated.headers, updated.tags, updated.metadata, updated.status, updated.attempt_count, updated.max_attempts, updated.next_attempt_at, updated.created_at, updated.updated_at, updated.claim_token, updated.claimed_by, updated.claimed_at, updated.lease_expires_at, updated.provider, updated.provider_message_id, updated.last_error, updated.sent_at, updated.ambiguous_since, updated.carried, updated.expires_at, updated.priority, updated.claim_order_at, updated.attachment_count, updated.previous_state
FROM updated;

-- step 2
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1_1::VARCHAR) AND hook_endpoints.enabled = true;
