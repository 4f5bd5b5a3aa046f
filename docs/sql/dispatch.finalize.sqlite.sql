-- dispatch.finalize (sqlite)
-- Record what the worker decided about claimed messages (by message id), only where the claim
-- is still ours.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.id IN (:id_1_1) AND outbox_messages.claim_token = :param_1;

-- step 2
UPDATE outbox_messages SET status='sent', attempt_count=(outbox_messages.attempt_count + :attempt_count_1), updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at, provider=:provider, provider_message_id=:provider_message_id, last_error=:last_error, sent_at=:sent_at, ambiguous_since=:ambiguous_since WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('processing') AND outbox_messages.id IN (:id_2_1) AND outbox_messages.claim_token = :param_1 RETURNING id, tenant_id, status, attempt_count, template_name, metadata, provider_message_id, last_error, claimed_by, to_address, provider;

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

-- step 8
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.id IN (:id_1_1) AND outbox_messages.claim_token = :param_1;

-- step 9
UPDATE outbox_messages SET status='retrying', attempt_count=(outbox_messages.attempt_count + :attempt_count_1), next_attempt_at=:next_attempt_at, updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at, provider=:provider, last_error=:last_error, ambiguous_since=:ambiguous_since, claim_order_at=CASE outbox_messages.priority WHEN :param_1 THEN :param_2 WHEN :param_3 THEN :param_4 ELSE :param_5 END WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('processing') AND outbox_messages.id IN (:id_2_1) AND outbox_messages.claim_token = :param_6 RETURNING id, tenant_id, status, attempt_count, template_name, metadata, provider_message_id, last_error, claimed_by, to_address, provider;

-- step 10
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 11
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending') AND email_verifications.message_id IN (:message_id_1_1);

-- step 12
UPDATE email_verifications SET state='sent', updated_at=:updated_at, sent_at=:sent_at WHERE email_verifications.id IN (:id_1_1) AND email_verifications.state IN ('send_pending') AND email_verifications.message_id IN (:message_id_1_1) RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count, message_id, template_name, redirect_url, created_at, updated_at, sent_at, verified_at;

-- step 13
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
