-- hooks.sweep (postgresql)
-- Deliveries whose lease ran out (their worker died or hung mid-POST) go back to `retrying`,
-- due now: the POST may have arrived, so the receiver may see it twice, with the same
-- webhook-id. The attempt counts: a delivery that kills its worker each time still ends dead.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH locked AS
(SELECT hook_deliveries.id AS id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.lease_expires_at < :lease_expires_at_1::TIMESTAMP WITH TIME ZONE ORDER BY hook_deliveries.lease_expires_at
 LIMIT :param_11::INTEGER FOR UPDATE SKIP LOCKED),
updated AS
(UPDATE hook_deliveries SET status='retrying', attempts=(hook_deliveries.attempts + :attempts_2::INTEGER), next_attempt_at=:param_4::TIMESTAMP WITH TIME ZONE, updated_at=:param_5::TIMESTAMP WITH TIME ZONE, claim_token=:param_6::UUID, claimed_by=:param_7::VARCHAR, lease_expires_at=:param_8::TIMESTAMP WITH TIME ZONE, last_status_code=:param_9::INTEGER, last_error=:param_10::VARCHAR FROM locked WHERE hook_deliveries.id = locked.id RETURNING hook_deliveries.id, hook_deliveries.endpoint_id, hook_deliveries.tenant_id, hook_deliveries.event, hook_deliveries.message_id, hook_deliveries.webhook_id, hook_deliveries.payload, hook_deliveries.status, hook_deliveries.attempts, hook_deliveries.max_attempts, hook_deliveries.next_attempt_at, hook_deliveries.created_at, hook_deliveries.updated_at, hook_deliveries.delivered_at, hook_deliveries.claim_token, hook_deliveries.claimed_by, hook_deliveries.lease_expires_at, hook_deliveries.last_status_code, hook_deliveries.last_error, locked.previous_state),
logged AS
(INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, detail, status_code, attempt) SELECT updated.id AS id, updated.previous_state AS previous_state, updated.status AS status, :param_1::TIMESTAMP WITH TIME ZONE AS anon_1, :param_2::VARCHAR AS anon_2, :param_3::VARCHAR AS anon_3, updated.last_status_code AS last_status_code, updated.attempts + :attempts_1::INTEGER AS anon_4
FROM updated)
 SELECT updated.id, updated.endpoint_id, updated.tenant_id, updated.event, updated.message_id, updated.webhook_id, updated.payload, updated.status, updated.attempts, updated.max_attempts, updated.next_attempt_at, updated.created_at, updated.updated_at, updated.delivered_at, updated.claim_token, updated.claimed_by, updated.lease_expires_at, updated.last_status_code, updated.last_error, updated.previous_state
FROM updated;
