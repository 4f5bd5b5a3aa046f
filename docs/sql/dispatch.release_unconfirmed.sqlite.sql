-- dispatch.release_unconfirmed (sqlite)
-- Hand back, unsent and with no attempt spent, what claims under `tokens` still hold: claims
-- whose COMMIT went through while their worker heard an error, so the worker never had those
-- messages and nobody sent them. A row swept since is `unknown`, left alone.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.claim_token IN (:claim_token_1_1);

-- step 2
UPDATE outbox_messages SET status=CASE WHEN (outbox_messages.attempt_count = :attempt_count_1) THEN 'pending' ELSE 'retrying' END, updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('processing') AND outbox_messages.claim_token IN (:claim_token_1_1) RETURNING id, tenant_id, status, attempt_count, template_name, metadata, provider_message_id, last_error, claimed_by, to_address, provider;

-- step 3
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 4
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_failed') AND email_verifications.message_id IN (:message_id_1_1);

-- step 5
UPDATE email_verifications SET state='send_pending', updated_at=:updated_at WHERE email_verifications.id IN (:id_1_1) AND email_verifications.state IN ('send_failed') AND email_verifications.message_id IN (:message_id_1_1) RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count, message_id, template_name, redirect_url, created_at, updated_at, sent_at, verified_at;

-- step 6
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
