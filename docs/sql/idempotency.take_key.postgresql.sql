-- idempotency.take_key (postgresql)
-- Claim the key; raises IntegrityError when another request holds it.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO idempotency_records (tenant_id, idempotency_key, operation, fingerprint, created_at, expires_at) VALUES (:tenant_id::VARCHAR, :idempotency_key::VARCHAR, :operation::VARCHAR, :fingerprint::VARCHAR, :created_at::TIMESTAMP WITH TIME ZONE, :expires_at::TIMESTAMP WITH TIME ZONE) RETURNING idempotency_records.id;
