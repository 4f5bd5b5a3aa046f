-- idempotency.record_response (sqlite)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE idempotency_records SET resource_id=:resource_id, response_status=:response_status, response_body=:response_body WHERE idempotency_records.tenant_id = :tenant_id_1 AND idempotency_records.idempotency_key = :idempotency_key_1;
