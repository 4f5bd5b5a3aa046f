-- events.match (mysql)
-- Our message for an event: by our id carried in a header or tag, else by the provider's id
-- recorded when it accepted the message.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count
FROM outbox_messages
WHERE outbox_messages.id = :id_1;

-- step 2
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key, outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address, outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data, outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status, outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at, outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token, outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at, outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error, outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried, outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at, outbox_messages.attachment_count
FROM outbox_messages
WHERE outbox_messages.provider_message_id = :provider_message_id_1
 LIMIT :param_1;
