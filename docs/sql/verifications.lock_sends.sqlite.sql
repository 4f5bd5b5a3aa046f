-- verifications.lock_sends (sqlite)
-- Hold the tenant's verification-send lock until the transaction ends.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT tenants.id
FROM tenants
WHERE tenants.id = :id_1;
