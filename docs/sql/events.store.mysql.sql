-- events.store (mysql)
-- Keep the event (raw payload too); None if it was stored before (a resend).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT provider_events.id
FROM provider_events
WHERE provider_events.dedup_key = :dedup_key_1;

-- step 2
INSERT INTO provider_events (provider, dedup_key, kind, bounce_type, provider_event, occurred_at, received_at, provider_message_id, message_id, tenant_id, recipient, detail, raw) VALUES (:provider, :dedup_key, :kind, :bounce_type, :provider_event, :occurred_at, :received_at, :provider_message_id, :message_id, :tenant_id, :recipient, :detail, :raw);

-- step 3
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1_1) AND hook_endpoints.enabled = true;
