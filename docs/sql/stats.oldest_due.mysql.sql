-- stats.oldest_due (mysql)
-- When the longest-waiting claimable message became due (None: nothing is waiting).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT min(claimable_at) AS min_1
FROM outbox_messages
WHERE claimable_at <= :claimable_at_1;
