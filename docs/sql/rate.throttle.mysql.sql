-- rate.throttle (mysql)
-- The provider throttled a send: lower `provider`'s rate for every replica for `cooldown`
-- seconds, and hold back every slot for its `retry_after` hint, if any. False when the
-- provider has no row (nothing was reserved, so nothing was sent).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE provider_rates SET lowered_rate=CASE WHEN (provider_rates.settles_at > UNIX_TIMESTAMP(NOW(6))) THEN provider_rates.lowered_rate ELSE greatest(CASE WHEN (provider_rates.lowered_until > UNIX_TIMESTAMP(NOW(6))) THEN least(provider_rates.lowered_rate + (:lowered_rate_1 - provider_rates.lowered_rate) * (:param_1 - (provider_rates.lowered_until - UNIX_TIMESTAMP(NOW(6))) / :param_2), :least_1) ELSE :param_3 END * :param_4, :greatest_1) END, settles_at=CASE WHEN (provider_rates.settles_at > UNIX_TIMESTAMP(NOW(6))) THEN provider_rates.settles_at ELSE greatest(provider_rates.next_slot_at, UNIX_TIMESTAMP(NOW(6))) + :greatest_2 END, lowered_until=(UNIX_TIMESTAMP(NOW(6)) + :UNIX_TIMESTAMP_NOW_6_1), next_slot_at=greatest(provider_rates.next_slot_at, UNIX_TIMESTAMP(NOW(6)) + :UNIX_TIMESTAMP_NOW_6_2) WHERE provider_rates.provider = :provider_1;
