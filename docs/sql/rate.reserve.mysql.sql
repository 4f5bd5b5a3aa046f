-- rate.reserve (mysql)
-- Take `count` consecutive send slots from `provider`'s schedule at PROVIDER_RATE `rate` (or
-- the lowered rate in force, climbing back over `cooldown`), for the whole fleet; the answer
-- says when each slot comes, on the database's clock.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT provider_rates.next_slot_at, provider_rates.lowered_rate, provider_rates.lowered_until, provider_rates.settles_at, UNIX_TIMESTAMP(SYSDATE(6)) AS now
FROM provider_rates
WHERE provider_rates.provider = :provider_1 FOR UPDATE;

-- step 2
UPDATE provider_rates SET next_slot_at=:next_slot_at WHERE provider_rates.provider = :provider_1;
