-- dispatch.release_unconfirmed (postgresql)
-- Hand back, unsent and with no attempt spent, what claims under `tokens` still hold: claims
-- whose COMMIT went through while their worker heard an error, so the worker never had those
-- messages and nobody sent them. A row swept since is `unknown`, left alone.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH locked AS
(SELECT outbox_messages.id AS id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.claim_token IN (:claim_token_1_1::UUID) FOR UPDATE),
updated AS
(UPDATE outbox_messages SET status=CASE WHEN (outbox_messages.attempt_count = :attempt_count_2::INTEGER) THEN 'pending' ELSE 'retrying' END, updated_at=:param_4::TIMESTAMP WITH TIME ZONE, claim_token=:param_5::UUID, claimed_by=:param_6::VARCHAR, claimed_at=:param_7::TIMESTAMP WITH TIME ZONE, lease_expires_at=:param_8::TIMESTAMP WITH TIME ZONE FROM locked WHERE outbox_messages.id = locked.id RETURNING outbox_messages.id, outbox_messages.tenant_id, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.template_name, outbox_messages.metadata, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.claimed_by, outbox_messages.to_address, outbox_messages.provider, locked.previous_state),
logged AS
(INSERT INTO message_events (message_id, from_status, to_status, at, actor, detail, provider_message_id, attempt) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.status AS status, :param_1::TIMESTAMP WITH TIME ZONE AS anon_1, :param_2::VARCHAR AS anon_2, :param_3::VARCHAR AS anon_3, updated.provider_message_id AS provider_message_id, updated.attempt_count + :attempt_count_1::INTEGER AS anon_4
FROM updated)
 SELECT updated.id, updated.tenant_id, updated.status, updated.attempt_count, updated.template_name, updated.metadata, updated.provider_message_id, updated.last_error, updated.claimed_by, updated.to_address, updated.provider, updated.previous_state
FROM updated;

-- step 2
WITH locked AS
(SELECT email_verifications.id AS id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_failed') AND email_verifications.message_id IN (:message_id_1_1::UUID) FOR UPDATE),
updated AS
(UPDATE email_verifications SET state='send_pending', updated_at=:param_4::TIMESTAMP WITH TIME ZONE FROM locked WHERE email_verifications.id = locked.id RETURNING email_verifications.id, email_verifications.tenant_id, email_verifications.email, email_verifications.state, email_verifications.token_digest, email_verifications.expires_at, email_verifications.confirm_attempts, email_verifications.send_count, email_verifications.message_id, email_verifications.template_name, email_verifications.redirect_url, email_verifications.created_at, email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at, locked.previous_state),
logged AS
(INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, detail, message_id) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.state AS state, :param_1::TIMESTAMP WITH TIME ZONE AS anon_1, :param_2::VARCHAR AS anon_2, :param_3::VARCHAR AS anon_3, updated.message_id AS message_id
FROM updated)
 SELECT updated.id, updated.tenant_id, updated.email, updated.state, updated.token_digest, updated.expires_at, updated.confirm_attempts, updated.send_count, updated.message_id, updated.template_name, updated.redirect_url, updated.created_at, updated.updated_at, updated.sent_at, updated.verified_at, updated.previous_state
FROM updated;
