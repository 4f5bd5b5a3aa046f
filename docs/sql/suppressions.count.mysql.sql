-- suppressions.count (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT count(*) AS count_1
FROM suppressions;
