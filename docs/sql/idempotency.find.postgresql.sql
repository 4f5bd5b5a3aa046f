-- idempotency.find (postgresql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT idempotency_records.id, idempotency_records.tenant_id, idempotency_records.idempotency_key, idempotency_records.operation, idempotency_records.fingerprint, idempotency_records.resource_id, idempotency_records.response_status, idempotency_records.response_body, idempotency_records.created_at, idempotency_records.expires_at
FROM idempotency_records
WHERE idempotency_records.tenant_id = :tenant_id_1::VARCHAR AND idempotency_records.idempotency_key = :idempotency_key_1::VARCHAR;
