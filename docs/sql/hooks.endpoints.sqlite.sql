-- hooks.endpoints (sqlite)
-- Oldest first; one tenant's, or everyone's.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.url, hook_endpoints.events, hook_endpoints.enabled, hook_endpoints.description, hook_endpoints.secret, hook_endpoints.created_at, hook_endpoints.updated_at
FROM hook_endpoints
WHERE hook_endpoints.tenant_id = :tenant_id_1 ORDER BY hook_endpoints.created_at, hook_endpoints.id;
