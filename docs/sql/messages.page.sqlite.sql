-- messages.page (sqlite)
-- Newest first (ids are time-ordered), up to `limit`, and whether more follow; with their
-- attachments (references, not bytes).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count
FROM outbox_messages
WHERE outbox_messages.status = :status_1 AND outbox_messages.tenant_id = :tenant_id_1 AND lower(outbox_messages.to_address) = :address_1 AND outbox_messages.id < :id_1 ORDER BY outbox_messages.id DESC
 LIMIT :param_1 OFFSET :param_2;

-- step 2
SELECT message_attachments.message_id, message_attachments.filename, message_attachments.content_type, attachments.size, message_attachments.sha256, message_attachments.content_id
FROM message_attachments JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id IN (:message_id_1_1) ORDER BY message_attachments.message_id, message_attachments.position;
