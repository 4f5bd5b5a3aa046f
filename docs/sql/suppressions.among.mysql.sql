-- suppressions.among (mysql)
-- Which of these (tenant, address) pairs are suppressed (addresses compared in lower case).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT suppressions.tenant_id, suppressions.email
FROM suppressions
WHERE suppressions.tenant_id IN (:tenant_id_1_1) AND suppressions.email IN (:email_1_1);
