-- hooks.claim (mysql)
-- Take up to `limit` due deliveries of enabled endpoints under one claim token, oldest due
-- first; other claimers skip what this one locked (see transition.py).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT hook_deliveries.id
FROM hook_deliveries
WHERE hook_deliveries.status IN ('pending', 'retrying') AND claimable_at <= :claimable_at_1 AND hook_deliveries.endpoint_id IN (SELECT hook_endpoints.id
FROM hook_endpoints
WHERE hook_endpoints.enabled = true) ORDER BY claimable_at, hook_deliveries.id
 LIMIT :param_1;

-- step 2
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries FORCE INDEX (PRIMARY)
WHERE hook_deliveries.id IN (:id_1_1) AND hook_deliveries.status IN ('pending', 'retrying') AND claimable_at <= :claimable_at_1 AND hook_deliveries.endpoint_id IN (SELECT hook_endpoints.id
FROM hook_endpoints
WHERE hook_endpoints.enabled = true) ORDER BY hook_deliveries.id FOR UPDATE SKIP LOCKED;

-- step 3
UPDATE hook_deliveries SET status='processing', updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, lease_expires_at=:lease_expires_at WHERE hook_deliveries.id IN (:id_1_1);

-- step 4
SELECT hook_deliveries.id, hook_deliveries.endpoint_id, hook_deliveries.tenant_id, hook_deliveries.event, hook_deliveries.message_id, hook_deliveries.webhook_id, hook_deliveries.payload, hook_deliveries.status, hook_deliveries.attempts, hook_deliveries.max_attempts, hook_deliveries.next_attempt_at, hook_deliveries.created_at, hook_deliveries.updated_at, hook_deliveries.delivered_at, hook_deliveries.claim_token, hook_deliveries.claimed_by, hook_deliveries.lease_expires_at, hook_deliveries.last_status_code, hook_deliveries.last_error
FROM hook_deliveries
WHERE hook_deliveries.id IN (:id_1_1);

-- step 5
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt, status_code, detail) VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);  -- once per row (executemany)

-- step 6
SELECT hook_endpoints.id, hook_endpoints.url, hook_endpoints.secret
FROM hook_endpoints
WHERE hook_endpoints.id IN (:id_1_1);
