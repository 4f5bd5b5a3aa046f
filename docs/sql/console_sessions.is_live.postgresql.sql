-- console_sessions.is_live (postgresql)
-- The session exists, has not expired, and began under the current password.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT console_sessions.id_digest
FROM console_sessions
WHERE console_sessions.id_digest = :id_digest_1::VARCHAR AND console_sessions.password_fingerprint = :password_fingerprint_1::VARCHAR AND console_sessions.expires_at > :expires_at_1::TIMESTAMP WITH TIME ZONE;
