-- stats.sent_per_bucket (postgresql)
-- Messages sent per time bucket, oldest first; each a range count on (to_status, at).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT count(*) AS count_1
FROM message_events
WHERE message_events.to_status = :to_status_1::VARCHAR AND message_events.at >= :at_1::TIMESTAMP WITH TIME ZONE AND message_events.at < :at_2::TIMESTAMP WITH TIME ZONE;

-- step 2
SELECT count(*) AS count_1
FROM message_events
WHERE message_events.to_status = :to_status_1::VARCHAR AND message_events.at >= :at_1::TIMESTAMP WITH TIME ZONE AND message_events.at < :at_2::TIMESTAMP WITH TIME ZONE;
