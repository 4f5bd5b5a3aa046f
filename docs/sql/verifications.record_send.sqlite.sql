-- verifications.record_send (sqlite)
-- The send's row (the per-address limit counts them) and one more in its tenant's minute (the
-- tenant's limit sums those). Runs under lock_sends, so the UPDATE-then-INSERT cannot race
-- another send of the tenant.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO verification_sends (tenant_id, email, verification_id, at) VALUES (:tenant_id, :email, :verification_id, :at);

-- step 2
UPDATE verification_send_counts SET n=(verification_send_counts.n + :n_1) WHERE verification_send_counts.tenant_id = :tenant_id_1 AND verification_send_counts.minute = :minute_1;
