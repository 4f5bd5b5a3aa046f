-- suppressions.add (mysql)
-- Suppress an address; False if it already was (the first reason is kept).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT suppressions.id
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id_1 AND suppressions.email = :email_1;

-- step 2
INSERT INTO suppressions (tenant_id, email, reason, detail, source_event_id, created_at) VALUES (:tenant_id, :email, :reason, :detail, :source_event_id, :created_at) ON DUPLICATE KEY UPDATE id = suppressions.id;
