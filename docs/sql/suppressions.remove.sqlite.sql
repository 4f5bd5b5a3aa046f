-- suppressions.remove (sqlite)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
DELETE FROM suppressions WHERE suppressions.tenant_id = :tenant_id_1 AND suppressions.email = :email_1;
