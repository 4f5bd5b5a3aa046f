-- verifications.follow_messages (sqlite)
-- Carry outbox results over to the verifications whose current email they concern.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending') AND email_verifications.message_id IN (:message_id_1_1);

-- step 2
UPDATE email_verifications SET state='sent', updated_at=:updated_at, sent_at=:sent_at WHERE email_verifications.id IN (:id_1_1) AND email_verifications.state IN ('send_pending') AND email_verifications.message_id IN (:message_id_1_1) RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count, message_id, template_name, redirect_url, created_at, updated_at, sent_at, verified_at;

-- step 3
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
