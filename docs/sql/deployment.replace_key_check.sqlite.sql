-- deployment.replace_key_check (sqlite)
-- Store the check value in place of whatever is stored (the operator changed the key).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO deployment (id, key_check, created_at) VALUES (:id, :key_check, :created_at) ON CONFLICT (id) DO UPDATE SET key_check = :param_1, created_at = :param_2;
