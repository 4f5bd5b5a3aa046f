-- stats.outbox_gauges (mysql)
-- The scrape's numbers: capped counts in one statement (each a range of an index that leads
-- with the filtered column), then `oldest_due`'s two short index ranges.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT (SELECT count(*) AS count_1
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_1
 LIMIT :param_1) AS anon_1) AS pending, (SELECT count(*) AS count_2
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_2
 LIMIT :param_2) AS anon_2) AS processing, (SELECT count(*) AS count_3
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_3
 LIMIT :param_3) AS anon_3) AS retrying, (SELECT count(*) AS count_4
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_4
 LIMIT :param_4) AS anon_4) AS unknown, (SELECT count(*) AS count_5
FROM (SELECT 1
FROM provider_events
WHERE provider_events.message_id IS NULL
 LIMIT :param_5) AS anon_5) AS unmatched;

-- step 2
SELECT min(claimable_at) AS min_1
FROM outbox_messages
WHERE claimable_at <= :claimable_at_1;
