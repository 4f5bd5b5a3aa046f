-- hooks.create_endpoint (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO hook_endpoints (id, tenant_id, url, events, enabled, description, secret, created_at, updated_at) VALUES (:id, :tenant_id, :url, :events, :enabled, :description, :secret, :created_at, :updated_at);
