-- events.store (postgresql)
-- Keep the event (raw payload too); None if it was stored before (a resend).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT provider_events.id
FROM provider_events
WHERE provider_events.dedup_key = :dedup_key_1::VARCHAR;

-- step 2
INSERT INTO provider_events (provider, dedup_key, kind, bounce_type, provider_event, occurred_at, received_at, provider_message_id, message_id, tenant_id, recipient, detail, raw) VALUES (:provider::VARCHAR, :dedup_key::VARCHAR, :kind::VARCHAR, :bounce_type::VARCHAR, :provider_event::VARCHAR, :occurred_at::TIMESTAMP WITH TIME ZONE, :received_at::TIMESTAMP WITH TIME ZONE, :provider_message_id::VARCHAR, :message_id::UUID, :tenant_id::VARCHAR, :recipient::VARCHAR, :detail::VARCHAR, :raw::JSONB) RETURNING provider_events.id;

-- step 3
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1_1::VARCHAR) AND hook_endpoints.enabled = true;
