-- idempotency.record_response (postgresql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE idempotency_records SET resource_id=:resource_id::VARCHAR, response_status=:response_status::INTEGER, response_body=:response_body::JSONB WHERE idempotency_records.tenant_id = :tenant_id_1::VARCHAR AND idempotency_records.idempotency_key = :idempotency_key_1::VARCHAR;
