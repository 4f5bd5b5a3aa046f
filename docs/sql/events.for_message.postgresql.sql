-- events.for_message (postgresql)
-- Every event about one message, oldest first.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT provider_events.id, provider_events.provider, provider_events.dedup_key, provider_events.kind, provider_events.bounce_type, provider_events.provider_event, provider_events.occurred_at, provider_events.received_at, provider_events.provider_message_id, provider_events.message_id, provider_events.tenant_id, provider_events.recipient, provider_events.detail, provider_events.raw
FROM provider_events
WHERE provider_events.message_id = :message_id_1::UUID OR provider_events.provider_message_id = :provider_message_id_1::VARCHAR ORDER BY provider_events.occurred_at, provider_events.id;
