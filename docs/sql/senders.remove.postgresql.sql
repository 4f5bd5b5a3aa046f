-- senders.remove (postgresql)
-- Take an address from a tenant's identities; False if it was not one.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
DELETE FROM tenant_senders WHERE tenant_senders.tenant_id = :tenant_id_1::VARCHAR AND lower(tenant_senders.address) = :lower_1::VARCHAR;
