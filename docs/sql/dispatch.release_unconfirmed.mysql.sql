-- dispatch.release_unconfirmed (mysql)
-- Hand back, unsent and with no attempt spent, what claims under `tokens` still hold: claims
-- whose COMMIT went through while their worker heard an error, so the worker never had those
-- messages and nobody sent them. A row swept since is `unknown`, left alone.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.claim_token IN (:claim_token_1_1) FOR UPDATE;

-- step 2
UPDATE outbox_messages SET status=CASE WHEN (outbox_messages.attempt_count = :attempt_count_1) THEN 'pending' ELSE 'retrying' END, updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at WHERE outbox_messages.id IN (:id_1_1);

-- step 3
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.template_name, outbox_messages.metadata, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.claimed_by, outbox_messages.to_address, outbox_messages.provider
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1_1);

-- step 4
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 5
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_failed') AND email_verifications.message_id IN (:message_id_1_1) FOR UPDATE;

-- step 6
UPDATE email_verifications SET state='send_pending', updated_at=:updated_at WHERE email_verifications.id IN (:id_1_1);

-- step 7
SELECT email_verifications.id, email_verifications.tenant_id, email_verifications.email, email_verifications.state, email_verifications.token_digest, email_verifications.expires_at, email_verifications.confirm_attempts, email_verifications.send_count, email_verifications.message_id, email_verifications.template_name, email_verifications.redirect_url, email_verifications.created_at, email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at
FROM email_verifications
WHERE email_verifications.id IN (:id_1_1);

-- step 8
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
