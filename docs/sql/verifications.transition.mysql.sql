-- verifications.transition (mysql)
-- Move the verifications matching `where` that `action` allows, and log each move.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_failed', 'send_pending', 'sent') AND email_verifications.id = :id_1 AND email_verifications.token_digest = :token_digest_1 AND email_verifications.confirm_attempts < :confirm_attempts_1 FOR UPDATE;

-- step 2
UPDATE email_verifications SET state='verified', updated_at=:updated_at, verified_at=:verified_at WHERE email_verifications.id IN (:id_1_1);

-- step 3
SELECT email_verifications.id, email_verifications.tenant_id, email_verifications.email, email_verifications.state, email_verifications.token_digest, email_verifications.expires_at, email_verifications.confirm_attempts, email_verifications.send_count, email_verifications.message_id, email_verifications.template_name, email_verifications.redirect_url, email_verifications.created_at, email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at
FROM email_verifications
WHERE email_verifications.id IN (:id_1_1);

-- step 4
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
