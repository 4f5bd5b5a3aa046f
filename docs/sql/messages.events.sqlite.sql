-- messages.events (sqlite)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT message_events.id, message_events.message_id, message_events.from_status, message_events.to_status, message_events.at, message_events.actor, message_events.attempt, message_events.provider_message_id, message_events.detail
FROM message_events
WHERE message_events.message_id = :message_id_1 ORDER BY message_events.id;
