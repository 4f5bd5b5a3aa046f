-- dispatch.claim (mysql)
-- Take up to `limit` due messages under one fresh claim token, in claim order: due time less
-- the priority's head start (content.HEAD_START), so higher priority goes first without
-- starving the rest. Their attachments come along (references, not bytes).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id
FROM outbox_messages
WHERE outbox_messages.status IN ('pending', 'retrying') AND claimable_at <= :claimable_at_1 AND outbox_messages.next_attempt_at <= :next_attempt_at_1 ORDER BY claimable_at, outbox_messages.id
 LIMIT :param_1;

-- step 2
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages FORCE INDEX (PRIMARY)
WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('pending', 'retrying') AND claimable_at <= :claimable_at_1 AND outbox_messages.next_attempt_at <= :next_attempt_at_1 ORDER BY outbox_messages.id FOR UPDATE SKIP LOCKED;

-- step 3
UPDATE outbox_messages SET status='processing', updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at WHERE outbox_messages.id IN (:id_1_1);

-- step 4
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1_1);

-- step 5
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)

-- step 6
SELECT message_attachments.message_id, message_attachments.filename, message_attachments.content_type, attachments.size, message_attachments.sha256, message_attachments.content_id
FROM message_attachments INNER JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id IN (:message_id_1_1) ORDER BY message_attachments.message_id, message_attachments.position;
