-- events.unmatched_count (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT count(*) AS count_1
FROM provider_events
WHERE provider_events.message_id IS NULL;
