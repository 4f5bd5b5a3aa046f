-- verifications.events (mysql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT verification_events.id, verification_events.verification_id, verification_events.from_state, verification_events.to_state, verification_events.at, verification_events.actor, verification_events.message_id, verification_events.detail
FROM verification_events
WHERE verification_events.verification_id = :verification_id_1 ORDER BY verification_events.id;
