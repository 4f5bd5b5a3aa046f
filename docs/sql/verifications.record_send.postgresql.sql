-- verifications.record_send (postgresql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO verification_sends (tenant_id, email, verification_id, at) VALUES (:tenant_id::VARCHAR, :email::VARCHAR, :verification_id::UUID, :at::TIMESTAMP WITH TIME ZONE) RETURNING verification_sends.id;
