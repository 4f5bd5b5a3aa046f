-- dispatch.claim (sqlite)
-- Take up to `limit` due messages under one fresh claim token, in claim order: due time less
-- the priority's head start (content.HEAD_START), so higher priority goes first without
-- starving the rest. Their attachments come along (references, not bytes).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('pending', 'retrying') AND outbox_messages.claim_order_at <= :claim_order_at_1 AND outbox_messages.next_attempt_at <= :next_attempt_at_1 ORDER BY outbox_messages.claim_order_at, outbox_messages.id
 LIMIT :param_1 OFFSET :param_2;

-- step 2
UPDATE outbox_messages SET status='processing', updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('pending', 'retrying') AND outbox_messages.claim_order_at <= :claim_order_at_1 AND outbox_messages.next_attempt_at <= :next_attempt_at_1 RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name, template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at, created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider, provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority, claim_order_at, attachment_count;

-- step 3
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 4
SELECT message_attachments.message_id, message_attachments.filename, message_attachments.content_type, attachments.size, message_attachments.sha256, message_attachments.content_id
FROM message_attachments JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id IN (:message_id_1_1) ORDER BY message_attachments.message_id, message_attachments.position;
