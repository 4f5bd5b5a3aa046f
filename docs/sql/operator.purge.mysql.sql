-- operator.purge (mysql)
-- Delete up to `limit` terminal messages (their events and attachment references too) last
-- changed before a cutoff.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.id
FROM outbox_messages
WHERE outbox_messages.status IN ('cancelled', 'dead', 'expired', 'failed', 'sent') AND outbox_messages.updated_at < :updated_at_1 ORDER BY outbox_messages.updated_at
 LIMIT :param_1;

-- step 2
DELETE FROM message_events WHERE message_events.message_id IN (:message_id_1_1);

-- step 3
DELETE FROM message_attachments WHERE message_attachments.message_id IN (:message_id_1_1);

-- step 4
DELETE FROM outbox_messages WHERE outbox_messages.id IN (:id_1_1) AND outbox_messages.status IN ('cancelled', 'dead', 'expired', 'failed', 'sent') AND outbox_messages.updated_at < :updated_at_1;
