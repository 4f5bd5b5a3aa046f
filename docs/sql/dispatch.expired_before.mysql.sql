-- dispatch.expired_before (mysql)
-- Which of these messages had a lease expire more than once (the alert's signal).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT message_events.message_id
FROM message_events
WHERE message_events.message_id IN (:message_id_1_1, :message_id_1_2) AND message_events.from_status = :from_status_1 AND message_events.to_status = :to_status_1 AND message_events.actor != :actor_1 AND message_events.detail LIKE :detail_1 GROUP BY message_events.message_id
HAVING count(*) > :count_1;
