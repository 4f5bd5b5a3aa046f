-- senders.listing (sqlite)
-- A tenant's sender identities, by address.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT tenant_senders.tenant_id, tenant_senders.address, tenant_senders.name, tenant_senders.created_at
FROM tenant_senders
WHERE tenant_senders.tenant_id = :tenant_id_1 ORDER BY tenant_senders.address;
