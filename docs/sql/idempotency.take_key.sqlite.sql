-- idempotency.take_key (sqlite)
-- Claim the key; raises IntegrityError when another request holds it.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO idempotency_records (tenant_id, idempotency_key, operation, fingerprint, created_at, expires_at) VALUES (:tenant_id, :idempotency_key, :operation, :fingerprint, :created_at, :expires_at);
