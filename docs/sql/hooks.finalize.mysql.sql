-- hooks.finalize (mysql)
-- Record each attempt where the claim is still `token`'s; return the deliveries changed (one
-- swept and claimed again by another worker meanwhile is left alone).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.id = :id_1 AND hook_deliveries.claim_token = :claim_token_1 FOR UPDATE;

-- step 2
UPDATE hook_deliveries SET status='delivered', attempts=(hook_deliveries.attempts + :attempts_1), updated_at=:updated_at, delivered_at=:delivered_at, claim_token=:claim_token, claimed_by=:claimed_by, lease_expires_at=:lease_expires_at, last_status_code=:last_status_code, last_error=:last_error WHERE hook_deliveries.id IN (:id_1_1);

-- step 3
SELECT hook_deliveries.id, hook_deliveries.endpoint_id, hook_deliveries.tenant_id, hook_deliveries.event, hook_deliveries.message_id, hook_deliveries.webhook_id, hook_deliveries.payload, hook_deliveries.status, hook_deliveries.attempts, hook_deliveries.max_attempts, hook_deliveries.next_attempt_at, hook_deliveries.created_at, hook_deliveries.updated_at, hook_deliveries.delivered_at, hook_deliveries.claim_token, hook_deliveries.claimed_by, hook_deliveries.lease_expires_at, hook_deliveries.last_status_code, hook_deliveries.last_error
FROM hook_deliveries
WHERE hook_deliveries.id IN (:id_1_1);

-- step 4
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt, status_code, detail) VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);  -- once per row (executemany)
