-- verifications.record_send (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO verification_sends (tenant_id, email, verification_id, at) VALUES (:tenant_id, :email, :verification_id, :at);
