-- operator.resolve (postgresql)
-- Settle an `unknown` message from evidence: it was accepted (sent) or it was not (failed).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH locked AS
(SELECT outbox_messages.id AS id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('unknown') AND outbox_messages.id = :id_1::UUID FOR UPDATE),
updated AS
(UPDATE outbox_messages SET status='sent', updated_at=:param_4::TIMESTAMP WITH TIME ZONE, provider_message_id=:param_5::VARCHAR, sent_at=:param_6::TIMESTAMP WITH TIME ZONE, ambiguous_since=:param_7::TIMESTAMP WITH TIME ZONE FROM locked WHERE outbox_messages.id = locked.id RETURNING outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count, locked.previous_state),
logged AS
(INSERT INTO message_events (message_id, from_status, to_status, at, actor, detail, provider_message_id, attempt) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.status AS status, :param_1::TIMESTAMP WITH TIME ZONE AS anon_1, :param_2::VARCHAR AS anon_2, :param_3::VARCHAR AS anon_3, updated.provider_message_id AS provider_message_id, updated.attempt_count + :attempt_count_1::INTEGER AS anon_4
FROM updated)
 SELECT updated.id, updated.tenant_id, updated.idempotency_key, updated.to_address, updated.to_name, updated.from_address, updated.subject, updated.template_name, updated.template_data, updated.headers, updated.tags, updated.metadata, updated.status, updated.attempt_count, updated.max_attempts, updated.next_attempt_at, updated.created_at, updated.updated_at, updated.claim_token, updated.claimed_by, updated.claimed_at, updated.lease_expires_at, updated.provider, updated.provider_message_id, updated.last_error, updated.sent_at, updated.ambiguous_since, updated.carried, updated.expires_at, updated.priority, updated.claim_order_at, updated.attachment_count, updated.previous_state
FROM updated;

-- step 2
WITH locked AS
(SELECT email_verifications.id AS id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending') AND email_verifications.message_id IN (:message_id_1_1::UUID) FOR UPDATE),
updated AS
(UPDATE email_verifications SET state='sent', updated_at=:param_4::TIMESTAMP WITH TIME ZONE, sent_at=:param_5::TIMESTAMP WITH TIME ZONE FROM locked WHERE email_verifications.id = locked.id RETURNING email_verifications.id, email_verifications.tenant_id, email_verifications.email, email_verifications.state, email_verifications.token_digest, email_verifications.expires_at, email_verifications.confirm_attempts, email_verifications.send_count, email_verifications.message_id, email_verifications.template_name, email_verifications.redirect_url, email_verifications.created_at, email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at, locked.previous_state),
logged AS
(INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, detail, message_id) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.state AS state, :param_1::TIMESTAMP WITH TIME ZONE AS anon_1, :param_2::VARCHAR AS anon_2, :param_3::VARCHAR AS anon_3, updated.message_id AS message_id
FROM updated)
 SELECT updated.id, updated.tenant_id, updated.email, updated.state, updated.token_digest, updated.expires_at, updated.confirm_attempts, updated.send_count, updated.message_id, updated.template_name, updated.redirect_url, updated.created_at, updated.updated_at, updated.sent_at, updated.verified_at, updated.previous_state
FROM updated;

-- step 3
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1_1::VARCHAR) AND hook_endpoints.enabled = true;
