-- hooks.delivery (sqlite)
-- A delivery and its history, oldest move first.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT hook_deliveries.id, hook_deliveries.endpoint_id, hook_deliveries.tenant_id, hook_deliveries.event, hook_deliveries.message_id, hook_deliveries.webhook_id, hook_deliveries.payload, hook_deliveries.status, hook_deliveries.attempts, hook_deliveries.max_attempts, hook_deliveries.next_attempt_at, hook_deliveries.created_at, hook_deliveries.updated_at, hook_deliveries.delivered_at, hook_deliveries.claim_token, hook_deliveries.claimed_by, hook_deliveries.lease_expires_at, hook_deliveries.last_status_code, hook_deliveries.last_error, hook_endpoints.url
FROM hook_deliveries LEFT OUTER JOIN hook_endpoints ON hook_endpoints.id = hook_deliveries.endpoint_id
WHERE hook_deliveries.id = :id_1 AND hook_deliveries.tenant_id = :tenant_id_1;

-- step 2
SELECT hook_delivery_events.id, hook_delivery_events.delivery_id, hook_delivery_events.from_status, hook_delivery_events.to_status, hook_delivery_events.at, hook_delivery_events.actor, hook_delivery_events.attempt, hook_delivery_events.status_code, hook_delivery_events.detail
FROM hook_delivery_events
WHERE hook_delivery_events.delivery_id = :delivery_id_1 ORDER BY hook_delivery_events.id;
