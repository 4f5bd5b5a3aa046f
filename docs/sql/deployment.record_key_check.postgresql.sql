-- deployment.record_key_check (postgresql)
-- Store the check value unless one is stored: replicas starting together on a new database all
-- try, the first one's value stays.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO deployment (id, key_check, created_at) VALUES (:id::INTEGER, :key_check::VARCHAR, :created_at::TIMESTAMP WITH TIME ZONE) ON CONFLICT (id) DO NOTHING;
