-- verifications.sends_since (mysql)
-- How many verification emails went out since a time, and the oldest of them.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT count(*) AS n, min(verification_sends.at) AS oldest
FROM verification_sends
WHERE verification_sends.tenant_id = :tenant_id_1 AND verification_sends.at > :at_1 AND verification_sends.email = :email_1;
