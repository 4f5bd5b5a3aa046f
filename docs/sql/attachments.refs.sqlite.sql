-- attachments.refs (sqlite)
-- The attachments of these messages, in order, without their bytes (messages without any are
-- left out).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT message_attachments.message_id, message_attachments.filename, message_attachments.content_type, attachments.size, message_attachments.sha256, message_attachments.content_id
FROM message_attachments JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id IN (:message_id_1_1, :message_id_1_2) ORDER BY message_attachments.message_id, message_attachments.position;
