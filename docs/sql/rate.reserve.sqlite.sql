-- rate.reserve (sqlite)
-- Take `count` consecutive send slots from `provider`'s schedule at PROVIDER_RATE `rate` (or
-- the lowered rate in force, climbing back over `cooldown`), for the whole fleet; the answer
-- says when each slot comes, on the database's clock.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE provider_rates SET next_slot_at=(max(provider_rates.next_slot_at, (julianday(:julianday_1) - :julianday_2) * :param_1 + :param_2) + :param_3 / (CASE WHEN (provider_rates.lowered_until > (julianday(:julianday_1) - :julianday_2) * :param_1) THEN min(provider_rates.lowered_rate + (:lowered_rate_1 - provider_rates.lowered_rate) * (:param_4 - (provider_rates.lowered_until - (julianday(:julianday_1) - :julianday_2) * :param_1) / (:param_5 + 0.0)), :min_1) ELSE :param_6 END + 0.0)) WHERE provider_rates.provider = :provider_1 RETURNING next_slot_at, lowered_rate, lowered_until, (julianday(:julianday_1) - :julianday_2) * :param_1 AS now;
