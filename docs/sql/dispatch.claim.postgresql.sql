-- dispatch.claim (postgresql)
-- Take up to `limit` due messages under one fresh claim token, in claim order: due time less
-- the priority's head start (content.HEAD_START), so higher priority goes first without
-- starving the rest. Their attachments come along (references, not bytes).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH locked AS
(SELECT outbox_messages.id AS id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('pending', 'retrying') AND outbox_messages.claim_order_at <= :due_by::TIMESTAMP WITH TIME ZONE AND outbox_messages.next_attempt_at <= :now::TIMESTAMP WITH TIME ZONE ORDER BY outbox_messages.claim_order_at, outbox_messages.id
 LIMIT :param_2::INTEGER FOR UPDATE SKIP LOCKED),
updated AS
(UPDATE outbox_messages SET status='processing', updated_at=:now::TIMESTAMP WITH TIME ZONE, claim_token=:claim_token::UUID, claimed_by=:claimed_by::VARCHAR, claimed_at=:now::TIMESTAMP WITH TIME ZONE, lease_expires_at=:lease_expires_at::TIMESTAMP WITH TIME ZONE FROM locked WHERE outbox_messages.id = locked.id RETURNING outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count, locked.previous_state),
logged AS
(INSERT INTO message_events (message_id, from_status, to_status, at, actor, detail, provider_message_id, attempt) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.status AS status, :now::TIMESTAMP WITH TIME ZONE AS anon_1, :actor::VARCHAR AS anon_2, :param_1::VARCHAR AS anon_3, updated.provider_message_id AS provider_message_id, updated.attempt_count + :attempt_count_1::INTEGER AS anon_4
FROM updated)
 SELECT updated.id, updated.tenant_id, updated.idempotency_key, updated.to_address, updated.to_name, updated.from_address, updated.subject, updated.template_name, updated.template_data, updated.headers, updated.tags, updated.metadata, updated.status, updated.attempt_count, updated.max_attempts, updated.next_attempt_at, updated.created_at, updated.updated_at, updated.claim_token, updated.claimed_by, updated.claimed_at, updated.lease_expires_at, updated.provider, updated.provider_message_id, updated.last_error, updated.sent_at, updated.ambiguous_since, updated.carried, updated.expires_at, updated.priority, updated.claim_order_at, updated.attachment_count, updated.previous_state
FROM updated;

-- step 2
SELECT message_attachments.message_id, message_attachments.filename, message_attachments.content_type, attachments.size, message_attachments.sha256, message_attachments.content_id
FROM message_attachments JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id IN (:message_id_1_1::UUID) ORDER BY message_attachments.message_id, message_attachments.position;
