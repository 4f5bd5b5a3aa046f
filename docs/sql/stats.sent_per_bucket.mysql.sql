-- stats.sent_per_bucket (mysql)
-- Messages sent per time bucket, oldest first; each a range count on (to_status, at).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT count(*) AS count_1
FROM message_events
WHERE message_events.to_status = :to_status_1 AND message_events.at >= :at_1 AND message_events.at < :at_2;

-- step 2
SELECT count(*) AS count_1
FROM message_events
WHERE message_events.to_status = :to_status_1 AND message_events.at >= :at_1 AND message_events.at < :at_2;
