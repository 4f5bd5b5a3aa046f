-- verifications.create (sqlite)
-- Insert a new verification in `created`; raises IntegrityError if one is active.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO email_verifications (id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count, message_id, template_name, redirect_url, created_at, updated_at, sent_at, verified_at) VALUES (:id, :tenant_id, :email, :state, :token_digest, :expires_at, :confirm_attempts, :send_count, :message_id, :template_name, :redirect_url, :created_at, :updated_at, :sent_at, :verified_at);

-- step 2
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);  -- once per row (executemany)
