-- enqueue.enqueue_first_use (postgresql)
-- PostgreSQL only: write `record` (an idempotency_records row, response included), the message
-- `row` and its history row in one statement, atomic by itself (run it in autocommit). False:
-- it wrote nothing; raises IntegrityError (the session's Conflict), having written nothing,
-- when a message without a record holds the key. Either way the caller takes the readable
-- path.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
WITH blocked AS (
    SELECT 1 FROM suppressions WHERE tenant_id = :tenant::VARCHAR AND email = :blocked_email::VARCHAR
), took AS (
    INSERT INTO idempotency_records (tenant_id, idempotency_key, created_at, expires_at,
        operation, fingerprint, resource_id, response_status, response_body)
    SELECT :tenant::VARCHAR, :key::VARCHAR, :now::TIMESTAMP WITH TIME ZONE, :record_expires_at::TIMESTAMP WITH TIME ZONE, :operation::VARCHAR, :fingerprint::VARCHAR, :resource_id::VARCHAR, :response_status::INTEGER, :response_body::JSONB
    WHERE NOT EXISTS (SELECT 1 FROM blocked)
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id
), made AS (
    INSERT INTO outbox_messages (id, tenant_id, idempotency_key, to_address, to_name, subject, template_name, template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at, created_at, updated_at, last_error, carried, expires_at, priority, claim_order_at, attachment_count)
    SELECT :id::UUID, :tenant::VARCHAR, :key::VARCHAR, :to_address::VARCHAR, :to_name::VARCHAR, :subject::VARCHAR, :template_name::VARCHAR, :template_data::JSONB, :headers::JSONB, :tags::JSONB, :metadata::JSONB, :status::VARCHAR, :attempt_count::INTEGER, :max_attempts::INTEGER, :next_attempt_at::TIMESTAMP WITH TIME ZONE, :now::TIMESTAMP WITH TIME ZONE, :now::TIMESTAMP WITH TIME ZONE, :last_error::VARCHAR, :carried::JSONB, :expires_at::TIMESTAMP WITH TIME ZONE, :priority::SMALLINT, :claim_order_at::TIMESTAMP WITH TIME ZONE, :attachment_count::SMALLINT FROM took
    RETURNING id, status
), made_history AS (
    INSERT INTO message_events (message_id, to_status, at, actor, attempt, detail)
    SELECT id, status, :now::TIMESTAMP WITH TIME ZONE, :event_actor::VARCHAR, :event_attempt::INTEGER, :event_detail::VARCHAR FROM made
    RETURNING 1
)
SELECT
    (SELECT count(*) FROM took) AS took,
    (SELECT count(*) FROM made) AS made,
    (SELECT count(*) FROM made_history) AS history,
    (SELECT pg_notify('mailbag_outbox', '') FROM made) AS notified;
