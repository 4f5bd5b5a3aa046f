-- senders.owned (mysql)
-- Which of these (tenant, address) pairs are sender identities, with their names; keys hold
-- the address in lower case.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT tenant_senders.tenant_id, tenant_senders.address, tenant_senders.name
FROM tenant_senders
WHERE tenant_senders.tenant_id IN (:tenant_id_1_1) AND lower(tenant_senders.address) IN (:lower_1_1);
