-- suppressions.listing (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT suppressions.id, suppressions.tenant_id, suppressions.email, suppressions.reason, suppressions.detail, suppressions.source_event_id, suppressions.created_at
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id_1 ORDER BY suppressions.created_at DESC, suppressions.id DESC
 LIMIT :param_1, :param_2;
