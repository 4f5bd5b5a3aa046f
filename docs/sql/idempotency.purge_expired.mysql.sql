-- idempotency.purge_expired (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT idempotency_records.id
FROM idempotency_records
WHERE idempotency_records.expires_at <= :expires_at_1
 LIMIT :param_1;

-- step 2
DELETE FROM idempotency_records WHERE idempotency_records.id IN (:id_1_1);
