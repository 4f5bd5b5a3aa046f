-- rate.schedule (mysql)
-- `provider`'s row and the database's time: what an operator (or a test) looks at.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT provider_rates.next_slot_at, provider_rates.lowered_rate, provider_rates.lowered_until, provider_rates.settles_at, UNIX_TIMESTAMP(NOW(6)) AS now
FROM provider_rates
WHERE provider_rates.provider = :provider_1;
