-- deployment.stored_key_check (sqlite)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT deployment.key_check
FROM deployment
WHERE deployment.id = :id_1;
