-- hooks.sweep (sqlite)
-- Deliveries whose lease ran out (their worker died or hung mid-POST) go back to `retrying`,
-- due now: the POST may have arrived, so the receiver may see it twice, with the same
-- webhook-id. The attempt counts: a delivery that kills its worker each time still ends dead.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.lease_expires_at < :lease_expires_at_1 ORDER BY hook_deliveries.lease_expires_at
 LIMIT :param_1 OFFSET :param_2;

-- step 2
UPDATE hook_deliveries SET status='retrying', attempts=(hook_deliveries.attempts + :attempts_1), next_attempt_at=:next_attempt_at, updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by, lease_expires_at=:lease_expires_at, last_status_code=:last_status_code, last_error=:last_error WHERE hook_deliveries.id IN (:id_1_1) AND hook_deliveries.status IN ('processing') AND hook_deliveries.lease_expires_at < :lease_expires_at_1 RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts, max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by, lease_expires_at, last_status_code, last_error;

-- step 3
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt, status_code, detail) VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);  -- once per row (executemany)
