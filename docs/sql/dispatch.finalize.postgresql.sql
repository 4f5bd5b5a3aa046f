-- dispatch.finalize (postgresql)
-- Record what the worker decided about claimed messages (by message id), only where the claim
-- is still ours.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH locked AS
(SELECT outbox_messages.id AS id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.id = ANY (CAST(:ids::UUID[] AS UUID[])) AND outbox_messages.claim_token = :token::UUID FOR UPDATE),
updated AS
(UPDATE outbox_messages SET status='sent', attempt_count=(outbox_messages.attempt_count + :attempt_count_2::INTEGER), updated_at=:now::TIMESTAMP WITH TIME ZONE, claim_token=:param_1::UUID, claimed_by=:param_2::VARCHAR, claimed_at=:param_3::TIMESTAMP WITH TIME ZONE, lease_expires_at=:param_4::TIMESTAMP WITH TIME ZONE, provider=:provider::VARCHAR, provider_message_id=coalesce((CAST(:provider_message_id::VARCHAR(255)[] AS VARCHAR(255)[]))[array_position(CAST(:ids::UUID[] AS UUID[]), outbox_messages.id)], outbox_messages.provider_message_id), last_error=((CAST(:last_error::VARCHAR(2000)[] AS VARCHAR(2000)[]))[array_position(CAST(:ids::UUID[] AS UUID[]), outbox_messages.id)]), sent_at=:now::TIMESTAMP WITH TIME ZONE, ambiguous_since=:param_5::TIMESTAMP WITH TIME ZONE FROM locked WHERE outbox_messages.id = locked.id RETURNING outbox_messages.id, outbox_messages.tenant_id, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.template_name, outbox_messages.metadata, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.claimed_by, outbox_messages.to_address, outbox_messages.provider, locked.previous_state),
logged AS
(INSERT INTO message_events (message_id, from_status, to_status, at, actor, detail, provider_message_id, attempt) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.status AS status, :now::TIMESTAMP WITH TIME ZONE AS anon_1, :actor::VARCHAR AS anon_2, substr(updated.last_error, :substr_2::INTEGER, :substr_3::INTEGER) AS substr_1, updated.provider_message_id AS provider_message_id, updated.attempt_count + :attempt_count_1::INTEGER AS anon_3
FROM updated)
 SELECT updated.id, updated.tenant_id, updated.status, updated.attempt_count, updated.template_name, updated.metadata, updated.provider_message_id, updated.last_error, updated.claimed_by, updated.to_address, updated.provider, updated.previous_state
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

-- step 4
WITH locked AS
(SELECT outbox_messages.id AS id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.id = ANY (CAST(:ids::UUID[] AS UUID[])) AND outbox_messages.claim_token = :token::UUID FOR UPDATE),
updated AS
(UPDATE outbox_messages SET status='retrying', attempt_count=(outbox_messages.attempt_count + :attempt_count_2::INTEGER), next_attempt_at=((CAST(:next_attempt_at::TIMESTAMP WITH TIME ZONE[] AS TIMESTAMP WITH TIME ZONE[]))[array_position(CAST(:ids::UUID[] AS UUID[]), outbox_messages.id)]), updated_at=:now::TIMESTAMP WITH TIME ZONE, claim_token=:param_1::UUID, claimed_by=:param_2::VARCHAR, claimed_at=:param_3::TIMESTAMP WITH TIME ZONE, lease_expires_at=:param_4::TIMESTAMP WITH TIME ZONE, provider=:provider::VARCHAR, last_error=((CAST(:last_error::VARCHAR(2000)[] AS VARCHAR(2000)[]))[array_position(CAST(:ids::UUID[] AS UUID[]), outbox_messages.id)]), ambiguous_since=:param_5::TIMESTAMP WITH TIME ZONE, claim_order_at=CASE outbox_messages.priority WHEN :param_6::INTEGER THEN (CAST(:claim_order_low::TIMESTAMP WITH TIME ZONE[] AS TIMESTAMP WITH TIME ZONE[]))[array_position(CAST(:ids::UUID[] AS UUID[]), outbox_messages.id)] WHEN :param_7::INTEGER THEN (CAST(:claim_order_high::TIMESTAMP WITH TIME ZONE[] AS TIMESTAMP WITH TIME ZONE[]))[array_position(CAST(:ids::UUID[] AS UUID[]), outbox_messages.id)] ELSE (CAST(:claim_order_normal::TIMESTAMP WITH TIME ZONE[] AS TIMESTAMP WITH TIME ZONE[]))[array_position(CAST(:ids::UUID[] AS UUID[]), outbox_messages.id)] END FROM locked WHERE outbox_messages.id = locked.id RETURNING outbox_messages.id, outbox_messages.tenant_id, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.template_name, outbox_messages.metadata, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.claimed_by, outbox_messages.to_address, outbox_messages.provider, locked.previous_state),
logged AS
(INSERT INTO message_events (message_id, from_status, to_status, at, actor, detail, provider_message_id, attempt) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.status AS status, :now::TIMESTAMP WITH TIME ZONE AS anon_1, :actor::VARCHAR AS anon_2, substr(updated.last_error, :substr_2::INTEGER, :substr_3::INTEGER) AS substr_1, updated.provider_message_id AS provider_message_id, updated.attempt_count + :attempt_count_1::INTEGER AS anon_3
FROM updated)
 SELECT updated.id, updated.tenant_id, updated.status, updated.attempt_count, updated.template_name, updated.metadata, updated.provider_message_id, updated.last_error, updated.claimed_by, updated.to_address, updated.provider, updated.previous_state
FROM updated;

-- step 5
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
