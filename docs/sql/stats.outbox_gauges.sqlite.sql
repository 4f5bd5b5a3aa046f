-- stats.outbox_gauges (sqlite)
-- The scrape's numbers: capped counts in one statement (each a range of an index that leads
-- with the filtered column), then `oldest_due`'s two short index ranges.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
SELECT (SELECT count(*) AS count_1
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_1
 LIMIT :param_1 OFFSET :param_2) AS anon_1) AS pending, (SELECT count(*) AS count_2
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_2
 LIMIT :param_3 OFFSET :param_4) AS anon_2) AS processing, (SELECT count(*) AS count_3
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_3
 LIMIT :param_5 OFFSET :param_6) AS anon_3) AS retrying, (SELECT count(*) AS count_4
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_4
 LIMIT :param_7 OFFSET :param_8) AS anon_4) AS unknown, (SELECT count(*) AS count_5
FROM (SELECT 1
FROM provider_events
WHERE provider_events.message_id IS NULL
 LIMIT :param_9 OFFSET :param_10) AS anon_5) AS unmatched;

-- step 2
SELECT min(outbox_messages.claim_order_at) AS min_1
FROM outbox_messages
WHERE outbox_messages.status IN (:status_1_1, :status_1_2) AND outbox_messages.claim_order_at <= :claim_order_at_1;
