-- messages.count_by_status (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT outbox_messages.status, count(*) AS n
FROM outbox_messages GROUP BY outbox_messages.status;
