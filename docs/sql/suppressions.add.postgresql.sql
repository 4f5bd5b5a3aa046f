-- suppressions.add (postgresql)
-- Suppress an address; False if it already was (the first reason is kept).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT suppressions.id
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id_1::VARCHAR AND suppressions.email = :email_1::VARCHAR;

-- step 2
INSERT INTO suppressions (tenant_id, email, reason, detail, source_event_id, created_at) VALUES (:tenant_id::VARCHAR, :email::VARCHAR, :reason::VARCHAR, :detail::VARCHAR, :source_event_id::BIGINT, :created_at::TIMESTAMP WITH TIME ZONE) ON CONFLICT DO NOTHING RETURNING suppressions.id;
