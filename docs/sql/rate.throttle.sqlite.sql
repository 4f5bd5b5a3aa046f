-- rate.throttle (sqlite)
-- The provider throttled a send: lower `provider`'s rate for every replica for `cooldown`
-- seconds, and hold back every slot for its `retry_after` hint, if any. False when the
-- provider has no row (nothing was reserved, so nothing was sent).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE provider_rates SET lowered_rate=CASE WHEN (provider_rates.settles_at > (julianday(:julianday_1) - :julianday_2) * :param_1) THEN provider_rates.lowered_rate ELSE max(CASE WHEN (provider_rates.lowered_until > (julianday(:julianday_1) - :julianday_2) * :param_1) THEN min(provider_rates.lowered_rate + (:lowered_rate_1 - provider_rates.lowered_rate) * (:param_2 - (provider_rates.lowered_until - (julianday(:julianday_1) - :julianday_2) * :param_1) / (:param_3 + 0.0)), :min_1) ELSE :param_4 END * :param_5, :max_1) END, settles_at=CASE WHEN (provider_rates.settles_at > (julianday(:julianday_1) - :julianday_2) * :param_1) THEN provider_rates.settles_at ELSE max(provider_rates.next_slot_at, (julianday(:julianday_1) - :julianday_2) * :param_1) + :max_2 END, lowered_until=((julianday(:julianday_1) - :julianday_2) * :param_1 + :param_6), next_slot_at=max(provider_rates.next_slot_at, (julianday(:julianday_1) - :julianday_2) * :param_1 + :param_7) WHERE provider_rates.provider = :provider_1;
