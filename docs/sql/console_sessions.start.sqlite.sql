-- console_sessions.start (sqlite)
-- A new session; expired ones are cleared on the way (logins are rare, rows few).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
DELETE FROM console_sessions WHERE console_sessions.expires_at <= :expires_at_1;

-- step 2
INSERT INTO console_sessions (id_digest, password_fingerprint, created_at, expires_at) VALUES (:id_digest, :password_fingerprint, :created_at, :expires_at);
