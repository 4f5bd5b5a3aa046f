-- rate.reserve (postgresql)
-- Take `count` consecutive send slots from `provider`'s schedule at PROVIDER_RATE `rate` (or
-- the lowered rate in force, climbing back over `cooldown`), for the whole fleet; the answer
-- says when each slot comes, on the database's clock.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH clock AS
(SELECT CAST(EXTRACT(epoch FROM clock_timestamp()) AS DOUBLE PRECISION) AS now)
 UPDATE provider_rates SET next_slot_at=(greatest(provider_rates.next_slot_at, (SELECT clock.now
FROM clock) + :param_1) + :param_2::INTEGER / CAST(CASE WHEN (provider_rates.lowered_until > (SELECT clock.now
FROM clock)) THEN least(provider_rates.lowered_rate + (:lowered_rate_1 - provider_rates.lowered_rate) * (:param_3::INTEGER - (provider_rates.lowered_until - (SELECT clock.now
FROM clock)) / CAST(:param_4 AS DOUBLE PRECISION)), :least_1) ELSE :param_5 END AS DOUBLE PRECISION)) WHERE provider_rates.provider = :provider_1::VARCHAR RETURNING provider_rates.next_slot_at, provider_rates.lowered_rate, provider_rates.lowered_until, (SELECT clock.now
FROM clock) AS now;
