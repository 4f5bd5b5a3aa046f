-- verifications.expire_stale (sqlite)
-- Move up to `limit` verifications whose time is up but that nobody has read since (a read
-- expires them too) to `expired`, each with its event. Rows another transaction holds are
-- skipped; the next run takes them.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent') AND email_verifications.expires_at <= :expires_at_1
 LIMIT :param_1 OFFSET :param_2;

-- step 2
UPDATE email_verifications SET state='expired', updated_at=:updated_at WHERE email_verifications.id IN (:id_1_1) AND email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent') AND email_verifications.expires_at <= :expires_at_1 RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count, message_id, template_name, redirect_url, created_at, updated_at, sent_at, verified_at;

-- step 3
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
