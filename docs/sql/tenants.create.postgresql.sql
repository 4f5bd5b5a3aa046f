-- tenants.create (postgresql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO tenants (id, name, api_key_digest, api_key_prefix, created_at) VALUES (:id::VARCHAR, :name::VARCHAR, :api_key_digest::VARCHAR, :api_key_prefix::VARCHAR, :created_at::TIMESTAMP WITH TIME ZONE);
