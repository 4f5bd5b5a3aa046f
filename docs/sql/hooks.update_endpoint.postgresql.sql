-- hooks.update_endpoint (postgresql)
-- Change what is given; None if there is no such endpoint (in that tenant).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE hook_endpoints SET enabled=:enabled, updated_at=:updated_at::TIMESTAMP WITH TIME ZONE WHERE hook_endpoints.id = :id_1::UUID AND hook_endpoints.tenant_id = :tenant_id_1::VARCHAR;

-- step 2
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.url, hook_endpoints.events, hook_endpoints.enabled, hook_endpoints.description, hook_endpoints.secret, hook_endpoints.created_at, hook_endpoints.updated_at
FROM hook_endpoints
WHERE hook_endpoints.id = :id_1::UUID;
