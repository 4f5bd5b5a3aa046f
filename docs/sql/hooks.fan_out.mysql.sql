-- hooks.fan_out (mysql)
-- One delivery per (event, subscribed enabled endpoint of the subject's tenant); returns how
-- many. `facts` is asked only about subjects whose tenant has an endpoint, and each event's
-- payload is built once for all its endpoints (same webhook-id too).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1_1) AND hook_endpoints.enabled = true;

-- step 2
INSERT INTO hook_deliveries (id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts, max_attempts, next_attempt_at, created_at, updated_at) VALUES (:id, :endpoint_id, :tenant_id, :event, :message_id, :webhook_id, :payload, :status, :attempts, :max_attempts, :next_attempt_at, :created_at, :updated_at);  -- once per row (executemany)
