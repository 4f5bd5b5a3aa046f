-- verifications.tenant_sends_since (postgresql)
-- How many verification emails the tenant sent since a time, counted by whole minutes: the
-- minute holding `since` counts whole, so at most 61 rows are read whatever the traffic, and
-- the count errs only on the safe side (a send up to one minute older than the hour may still
-- count: the limit is never exceeded in any hour). With the count, when the oldest counted
-- minute stops counting, less an hour (as sends_since's oldest: Retry-After is that plus an
-- hour, less now).
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT sum(verification_send_counts.n) AS n, min(verification_send_counts.minute) AS oldest
FROM verification_send_counts
WHERE verification_send_counts.tenant_id = :tenant_id_1::VARCHAR AND verification_send_counts.minute >= :minute_1::TIMESTAMP WITH TIME ZONE;
