-- verifications.count_wrong_token (mysql)
-- A wrong confirmation token: one attempt fewer (not a transition, so no event).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE email_verifications SET confirm_attempts=(email_verifications.confirm_attempts + :confirm_attempts_1), updated_at=:updated_at WHERE email_verifications.id = :id_1 AND email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent');
