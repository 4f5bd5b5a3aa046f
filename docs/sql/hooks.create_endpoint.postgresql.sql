-- hooks.create_endpoint (postgresql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO hook_endpoints (id, tenant_id, url, events, enabled, description, secret, created_at, updated_at) VALUES (:id::UUID, :tenant_id::VARCHAR, :url::VARCHAR, :events::VARCHAR, :enabled, :description::VARCHAR, :secret::VARCHAR, :created_at::TIMESTAMP WITH TIME ZONE, :updated_at::TIMESTAMP WITH TIME ZONE);
