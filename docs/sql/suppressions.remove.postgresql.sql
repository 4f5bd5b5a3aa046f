-- suppressions.remove (postgresql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
DELETE FROM suppressions WHERE suppressions.tenant_id = :tenant_id_1::VARCHAR AND suppressions.email = :email_1::VARCHAR;
