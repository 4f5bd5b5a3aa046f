-- tenants.create (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO tenants (id, name, api_key_digest, api_key_prefix, created_at) VALUES (:id, :name, :api_key_digest, :api_key_prefix, :created_at);
