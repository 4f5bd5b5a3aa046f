-- attachments.purge_unreferenced (mysql)
-- Delete up to `limit` attachments no message references any more.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT attachments.sha256
FROM attachments
WHERE NOT (EXISTS (SELECT *
FROM message_attachments
WHERE message_attachments.sha256 = attachments.sha256))
 LIMIT :param_1;

-- step 2
DELETE FROM attachments WHERE attachments.sha256 IN (:sha256_1_1) AND NOT (EXISTS (SELECT *
FROM message_attachments
WHERE message_attachments.sha256 = attachments.sha256));
