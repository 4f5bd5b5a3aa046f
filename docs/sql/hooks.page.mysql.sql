-- hooks.page (mysql)
-- Deliveries newest first, `limit` of them after the cursor; and whether more follow.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT hook_deliveries.id, hook_deliveries.endpoint_id, hook_deliveries.tenant_id, hook_deliveries.event, hook_deliveries.message_id, hook_deliveries.webhook_id, hook_deliveries.payload, hook_deliveries.status, hook_deliveries.attempts, hook_deliveries.max_attempts, hook_deliveries.next_attempt_at, hook_deliveries.created_at, hook_deliveries.updated_at, hook_deliveries.delivered_at, hook_deliveries.claim_token, hook_deliveries.claimed_by, hook_deliveries.lease_expires_at, hook_deliveries.last_status_code, hook_deliveries.last_error, hook_endpoints.url
FROM hook_deliveries LEFT OUTER JOIN hook_endpoints ON hook_endpoints.id = hook_deliveries.endpoint_id
WHERE hook_deliveries.tenant_id = :tenant_id_1 AND (hook_deliveries.created_at < :created_at_1 OR hook_deliveries.created_at = :created_at_2 AND hook_deliveries.id < :id_1) ORDER BY hook_deliveries.created_at DESC, hook_deliveries.id DESC
 LIMIT :param_1;
