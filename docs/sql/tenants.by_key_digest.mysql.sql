-- tenants.by_key_digest (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT tenants.id, tenants.name, tenants.api_key_digest, tenants.api_key_prefix, tenants.created_at
FROM tenants
WHERE tenants.api_key_digest = :api_key_digest_1;
