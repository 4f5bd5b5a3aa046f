-- operator.resolve (sqlite)
-- Settle an `unknown` message from evidence: it was accepted (sent) or it was not (failed).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('unknown') AND outbox_messages.id = :id_1;

-- step 2
UPDATE outbox_messages SET status='sent', updated_at=:updated_at, provider_message_id=:provider_message_id, sent_at=:sent_at, ambiguous_since=:ambiguous_since WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('unknown') AND outbox_messages.id = :id_2 RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name, template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at, created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider, provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority, claim_order_at, attachment_count;

-- step 3
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 4
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending') AND email_verifications.message_id IN (:message_id_1_1);

-- step 5
UPDATE email_verifications SET state='sent', updated_at=:updated_at, sent_at=:sent_at WHERE email_verifications.id IN (:id_1_1) AND email_verifications.state IN ('send_pending') AND email_verifications.message_id IN (:message_id_1_1) RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count, message_id, template_name, redirect_url, created_at, updated_at, sent_at, verified_at;

-- step 6
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)

-- step 7
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1_1) AND hook_endpoints.enabled = 1;
