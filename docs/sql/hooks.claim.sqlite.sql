-- hooks.claim (sqlite)
-- Take up to `limit` due deliveries of enabled endpoints under one claim token, oldest due
-- first; other claimers skip what this one locked (see transition.py).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('pending', 'retrying') AND hook_deliveries.next_attempt_at <= :next_attempt_at_1 AND hook_deliveries.endpoint_id IN (SELECT hook_endpoints.id
FROM hook_endpoints
WHERE hook_endpoints.enabled = 1) ORDER BY hook_deliveries.next_attempt_at, hook_deliveries.id
 LIMIT :param_1 OFFSET :param_2;

-- step 2
UPDATE hook_deliveries SET status='processing', updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, lease_expires_at=:lease_expires_at WHERE hook_deliveries.id IN (:id_1_1) AND hook_deliveries.status IN ('pending', 'retrying') AND hook_deliveries.next_attempt_at <= :next_attempt_at_1 AND hook_deliveries.endpoint_id IN (SELECT hook_endpoints.id
FROM hook_endpoints
WHERE hook_endpoints.enabled = 1) RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts, max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by, lease_expires_at, last_status_code, last_error;

-- step 3
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt, status_code, detail) VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);  -- once per row (executemany)

-- step 4
SELECT hook_endpoints.id, hook_endpoints.url, hook_endpoints.secret
FROM hook_endpoints
WHERE hook_endpoints.id IN (:id_1_1);
