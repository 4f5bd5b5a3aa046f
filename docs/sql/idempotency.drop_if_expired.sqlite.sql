-- idempotency.drop_if_expired (sqlite)
-- An expired record no longer holds its key: remove it so the key can be used again.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
DELETE FROM idempotency_records WHERE idempotency_records.tenant_id = :tenant_id_1 AND idempotency_records.idempotency_key = :idempotency_key_1 AND idempotency_records.expires_at <= :expires_at_1;
