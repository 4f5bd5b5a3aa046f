-- enqueue.enqueue (mysql)
-- Insert messages, idempotently by (tenant, key), without ever aborting the transaction.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT tenant_senders.tenant_id, tenant_senders.address, tenant_senders.name
FROM tenant_senders
WHERE tenant_senders.tenant_id IN (:tenant_id_1_1) AND lower(tenant_senders.address) IN (:lower_1_1);

-- step 2
SELECT suppressions.tenant_id, suppressions.email
FROM suppressions
WHERE suppressions.tenant_id IN (:tenant_id_1_1) AND suppressions.email IN (:email_1_1);

-- step 3
INSERT INTO outbox_messages (id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name, template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at, created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider, provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority, claim_order_at, attachment_count) VALUES (:id, :tenant_id, :idempotency_key, :to_address, :to_name, :from_address, :subject, :template_name, :template_data, :headers, :tags, :metadata, :status, :attempt_count, :max_attempts, :next_attempt_at, :created_at, :updated_at, :claim_token, :claimed_by, :claimed_at, :lease_expires_at, :provider, :provider_message_id, :last_error, :sent_at, :ambiguous_since, :carried, :expires_at, :priority, :claim_order_at, :attachment_count) ON DUPLICATE KEY UPDATE id = outbox_messages.id;  -- once per row (executemany)

-- step 4
SELECT outbox_messages.id
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1_1);

-- step 5
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count
FROM outbox_messages
WHERE outbox_messages.tenant_id = :tenant_id_1 AND outbox_messages.idempotency_key IN (:idempotency_key_1_1) LOCK IN SHARE MODE;

-- step 6
SELECT attachments.sha256
FROM attachments
WHERE attachments.sha256 IN (:sha256_1_1) LOCK IN SHARE MODE;

-- step 7
INSERT INTO attachments (sha256, size, content, created_at) VALUES (:sha256, :size, :content, :created_at) ON DUPLICATE KEY UPDATE sha256 = attachments.sha256;  -- once per row (executemany)

-- step 8
INSERT INTO message_attachments (message_id, position, sha256, filename, content_type, content_id) VALUES (:message_id, :position, :sha256, :filename, :content_type, :content_id);  -- once per row (executemany)

-- step 9
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, provider_message_id, detail) VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id, :detail);  -- once per row (executemany)
