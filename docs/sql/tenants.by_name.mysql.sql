-- tenants.by_name (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT tenants.id, tenants.name, tenants.api_key_digest, tenants.api_key_prefix, tenants.created_at
FROM tenants
WHERE tenants.name = :name_1;
