-- senders.add (sqlite)
-- Let a tenant send from an address; False if it already could (its name is kept).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT tenant_senders.address
FROM tenant_senders
WHERE tenant_senders.tenant_id = :tenant_id_1 AND lower(tenant_senders.address) = :lower_1;

-- step 2
INSERT INTO tenant_senders (tenant_id, address, name, created_at) VALUES (:tenant_id, :address, :name, :created_at) ON CONFLICT DO NOTHING;
