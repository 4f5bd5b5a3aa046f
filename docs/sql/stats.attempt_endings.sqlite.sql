-- stats.attempt_endings (sqlite)
-- How attempts ended since a time: sent, retrying, failed, dead, unknown, released.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT message_events.to_status, count(*) AS n
FROM message_events
WHERE message_events.from_status = :from_status_1 AND message_events.at >= :at_1 GROUP BY message_events.to_status;
