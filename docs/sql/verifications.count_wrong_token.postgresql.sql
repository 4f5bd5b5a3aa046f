-- verifications.count_wrong_token (postgresql)
-- A wrong confirmation token: one attempt fewer (not a transition, so no event).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE email_verifications SET confirm_attempts=(email_verifications.confirm_attempts + :confirm_attempts_1::INTEGER), updated_at=:updated_at::TIMESTAMP WITH TIME ZONE WHERE email_verifications.id = :id_1::UUID AND email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent');
