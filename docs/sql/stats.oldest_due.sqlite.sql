-- stats.oldest_due (sqlite)
-- When the longest-waiting claimable message became due (None: nothing is waiting).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT min(outbox_messages.claim_order_at) AS min_1
FROM outbox_messages
WHERE outbox_messages.status IN (:status_1_1, :status_1_2) AND outbox_messages.claim_order_at <= :claim_order_at_1;
