-- rate.throttle (postgresql)
-- The provider throttled a send: lower `provider`'s rate for every replica for `cooldown`
-- seconds, and hold back every slot for its `retry_after` hint, if any. False when the
-- provider has no row (nothing was reserved, so nothing was sent).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH clock AS
(SELECT CAST(EXTRACT(epoch FROM clock_timestamp()) AS DOUBLE PRECISION) AS now)
 UPDATE provider_rates SET lowered_rate=CASE WHEN (provider_rates.settles_at > (SELECT clock.now
FROM clock)) THEN provider_rates.lowered_rate ELSE greatest(CASE WHEN (provider_rates.lowered_until > (SELECT clock.now
FROM clock)) THEN least(provider_rates.lowered_rate + (:lowered_rate_1 - provider_rates.lowered_rate) * (:param_1::INTEGER - (provider_rates.lowered_until - (SELECT clock.now
FROM clock)) / CAST(:param_2 AS DOUBLE PRECISION)), :least_1) ELSE :param_3 END * :param_4, :greatest_1) END, settles_at=CASE WHEN (provider_rates.settles_at > (SELECT clock.now
FROM clock)) THEN provider_rates.settles_at ELSE greatest(provider_rates.next_slot_at, (SELECT clock.now
FROM clock)) + :greatest_2 END, lowered_until=((SELECT clock.now
FROM clock) + :param_5), next_slot_at=greatest(provider_rates.next_slot_at, (SELECT clock.now
FROM clock) + :param_6) WHERE provider_rates.provider = :provider_1::VARCHAR;
