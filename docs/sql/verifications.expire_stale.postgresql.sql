-- verifications.expire_stale (postgresql)
-- Move up to `limit` verifications whose time is up but that nobody has read since (a read
-- expires them too) to `expired`, each with its event. Rows another transaction holds are
-- skipped; the next run takes them.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH locked AS
(SELECT email_verifications.id AS id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent') AND email_verifications.expires_at <= :expires_at_1::TIMESTAMP WITH TIME ZONE
 LIMIT :param_5::INTEGER FOR UPDATE SKIP LOCKED),
updated AS
(UPDATE email_verifications SET state='expired', updated_at=:param_4::TIMESTAMP WITH TIME ZONE FROM locked WHERE email_verifications.id = locked.id RETURNING email_verifications.id, email_verifications.tenant_id, email_verifications.email, email_verifications.state, email_verifications.token_digest, email_verifications.expires_at, email_verifications.confirm_attempts, email_verifications.send_count, email_verifications.message_id, email_verifications.template_name, email_verifications.redirect_url, email_verifications.created_at, email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at, locked.previous_state),
logged AS
(INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, detail, message_id) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.state AS state, :param_1::TIMESTAMP WITH TIME ZONE AS anon_1, :param_2::VARCHAR AS anon_2, :param_3::VARCHAR AS anon_3, updated.message_id AS message_id
FROM updated)
 SELECT updated.id, updated.tenant_id, updated.email, updated.state, updated.token_digest, updated.expires_at, updated.confirm_attempts, updated.send_count, updated.message_id, updated.template_name, updated.redirect_url, updated.created_at, updated.updated_at, updated.sent_at, updated.verified_at, updated.previous_state
FROM updated;
