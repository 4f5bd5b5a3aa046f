-- attachments.content (mysql)
-- One attachment of a message with its bytes, by its index in the message (the console's
-- download); None if the message has no such attachment.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT message_attachments.filename, message_attachments.content_type, attachments.size, message_attachments.sha256, message_attachments.content_id, attachments.content
FROM message_attachments INNER JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id = :message_id_1 AND message_attachments.position = :position_1;
