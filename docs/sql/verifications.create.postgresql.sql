-- verifications.create (postgresql)
-- Insert a new verification in `created`; raises IntegrityError if one is active.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
INSERT INTO email_verifications (id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count, message_id, template_name, redirect_url, created_at, updated_at, sent_at, verified_at) VALUES (:id::UUID, :tenant_id::VARCHAR, :email::VARCHAR, :state::VARCHAR, :token_digest::VARCHAR, :expires_at::TIMESTAMP WITH TIME ZONE, :confirm_attempts::INTEGER, :send_count::INTEGER, :message_id::UUID, :template_name::VARCHAR, :redirect_url::VARCHAR, :created_at::TIMESTAMP WITH TIME ZONE, :updated_at::TIMESTAMP WITH TIME ZONE, :sent_at::TIMESTAMP WITH TIME ZONE, :verified_at::TIMESTAMP WITH TIME ZONE);

-- step 2
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id, detail) VALUES (:verification_id::UUID, :from_state::VARCHAR, :to_state::VARCHAR, :at::TIMESTAMP WITH TIME ZONE, :actor::VARCHAR, :message_id::UUID, :detail::VARCHAR);  -- once per row (executemany)
