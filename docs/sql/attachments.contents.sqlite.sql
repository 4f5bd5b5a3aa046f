-- attachments.contents (sqlite)
-- The bytes of these attachments, by SHA-256 (what a worker sends).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT attachments.sha256, attachments.content
FROM attachments
WHERE attachments.sha256 IN (:sha256_1_1);
