-- dispatch.finalize (mysql)
-- Record what the worker decided about claimed messages (by message id), only where the claim
-- is still ours.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.id IN (:id_1_1) AND outbox_messages.claim_token = :param_1 FOR UPDATE;

-- step 2
UPDATE outbox_messages SET status='sent', attempt_count=(outbox_messages.attempt_count + :attempt_count_1), updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at, provider=:provider, provider_message_id=:provider_message_id, last_error=:last_error, sent_at=:sent_at, ambiguous_since=:ambiguous_since WHERE outbox_messages.id IN (:id_1_1);

-- step 3
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.template_name, outbox_messages.metadata, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.claimed_by, outbox_messages.to_address, outbox_messages.provider
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1_1);

-- step 4
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 5
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending') AND email_verifications.message_id IN (:message_id_1_1) FOR UPDATE;

-- step 6
UPDATE email_verifications SET state='sent', updated_at=:updated_at, sent_at=:sent_at WHERE email_verifications.id IN (:id_1_1);

-- step 7
SELECT email_verifications.id, email_verifications.tenant_id, email_verifications.email, email_verifications.state, email_verifications.token_digest, email_verifications.expires_at, email_verifications.confirm_attempts, email_verifications.send_count, email_verifications.message_id, email_verifications.template_name, email_verifications.redirect_url, email_verifications.created_at, email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at
FROM email_verifications
WHERE email_verifications.id IN (:id_1_1);

-- step 8
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)

-- step 9
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1_1) AND hook_endpoints.enabled = true;

-- step 10
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.id IN (:id_1_1) AND outbox_messages.claim_token = :param_1 FOR UPDATE;

-- step 11
UPDATE outbox_messages SET status='retrying', attempt_count=(outbox_messages.attempt_count + :attempt_count_1), next_attempt_at=:next_attempt_at, updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at, provider=:provider, last_error=:last_error, ambiguous_since=:ambiguous_since, claim_order_at=CASE outbox_messages.priority WHEN :param_1 THEN :param_2 WHEN :param_3 THEN :param_4 ELSE :param_5 END WHERE outbox_messages.id IN (:id_1_1);

-- step 12
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.template_name, outbox_messages.metadata, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.claimed_by, outbox_messages.to_address, outbox_messages.provider
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1_1);

-- step 13
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 14
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending') AND email_verifications.message_id IN (:message_id_1_1) FOR UPDATE;

-- step 15
UPDATE email_verifications SET state='sent', updated_at=:updated_at, sent_at=:sent_at WHERE email_verifications.id IN (:id_1_1);

-- step 16
SELECT email_verifications.id, email_verifications.tenant_id, email_verifications.email, email_verifications.state, email_verifications.token_digest, email_verifications.expires_at, email_verifications.confirm_attempts, email_verifications.send_count, email_verifications.message_id, email_verifications.template_name, email_verifications.redirect_url, email_verifications.created_at, email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at
FROM email_verifications
WHERE email_verifications.id IN (:id_1_1);

-- step 17
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
