-- verifications.transition (sqlite)
-- Move the verifications matching `where` that `action` allows, and log each move.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_failed', 'send_pending', 'sent') AND email_verifications.id = :id_1 AND email_verifications.token_digest = :token_digest_1 AND email_verifications.confirm_attempts < :confirm_attempts_1;

-- step 2
UPDATE email_verifications SET state='verified', updated_at=:updated_at, verified_at=:verified_at WHERE email_verifications.id IN (:id_1_1) AND email_verifications.state IN ('send_failed', 'send_pending', 'sent') AND email_verifications.id = :id_2 AND email_verifications.token_digest = :token_digest_1 AND email_verifications.confirm_attempts < :confirm_attempts_1 RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count, message_id, template_name, redirect_url, created_at, updated_at, sent_at, verified_at;

-- step 3
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
