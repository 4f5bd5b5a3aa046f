-- hooks.delete_endpoint (postgresql)
-- Remove an endpoint with its deliveries (their history goes by ON DELETE CASCADE).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.url, hook_endpoints.events, hook_endpoints.enabled, hook_endpoints.description, hook_endpoints.secret, hook_endpoints.created_at, hook_endpoints.updated_at
FROM hook_endpoints
WHERE hook_endpoints.id = :id_1::UUID AND hook_endpoints.tenant_id = :tenant_id_1::VARCHAR;

-- step 2
DELETE FROM hook_deliveries WHERE hook_deliveries.endpoint_id = :endpoint_id_1::UUID;

-- step 3
DELETE FROM hook_endpoints WHERE hook_endpoints.id = :id_1::UUID;
