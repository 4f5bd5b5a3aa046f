-- verifications.expire_stale (mysql)
-- Move up to `limit` verifications whose time is up but that nobody has read since (a read
-- expires them too) to `expired`, each with its event. Rows another transaction holds are
-- skipped; the next run takes them.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT email_verifications.id
FROM email_verifications
WHERE email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent') AND email_verifications.expires_at <= :expires_at_1
 LIMIT :param_1;

-- step 2
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications FORCE INDEX (PRIMARY)
WHERE email_verifications.id IN (:id_1_1) AND email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent') AND email_verifications.expires_at <= :expires_at_1 ORDER BY email_verifications.id FOR UPDATE SKIP LOCKED;

-- step 3
UPDATE email_verifications SET state='expired', updated_at=:updated_at WHERE email_verifications.id IN (:id_1_1);

-- step 4
SELECT email_verifications.id, email_verifications.tenant_id, email_verifications.email, email_verifications.state, email_verifications.token_digest, email_verifications.expires_at, email_verifications.confirm_attempts, email_verifications.send_count, email_verifications.message_id, email_verifications.template_name, email_verifications.redirect_url, email_verifications.created_at, email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at
FROM email_verifications
WHERE email_verifications.id IN (:id_1_1);

-- step 5
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
