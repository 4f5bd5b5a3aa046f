-- verifications.record_send (postgresql)
-- The send's row (the per-address limit counts them) and one more in its tenant's minute (the
-- tenant's limit sums those). Runs under lock_sends, so the UPDATE-then-INSERT cannot race
-- another send of the tenant.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO verification_sends (tenant_id, email, verification_id, at) VALUES (:tenant_id::VARCHAR, :email::VARCHAR, :verification_id::UUID, :at::TIMESTAMP WITH TIME ZONE) RETURNING verification_sends.id;

-- step 2
UPDATE verification_send_counts SET n=(verification_send_counts.n + :n_1::INTEGER) WHERE verification_send_counts.tenant_id = :tenant_id_1::VARCHAR AND verification_send_counts.minute = :minute_1::TIMESTAMP WITH TIME ZONE;
