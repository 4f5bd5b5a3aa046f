-- The SQL mailbag runs on SQLite: every store operation's statements,
-- in the order it runs them. The index with links is README.md in this directory.
-- Written by `python -m mailbag.sqldocs` from the store's plans; do not edit.
-- Parameters are named (:name); a list is expanded (:ids_1, :ids_2) as the driver
-- receives it. The values a plan was recorded with are samples: the SQL is its own.


-- === enqueue ===============================================================================

-- name: enqueue.enqueue --
-- Insert messages, idempotently by (tenant, key), without ever aborting the transaction.
-- step 1 of 9
SELECT tenant_senders.tenant_id, tenant_senders.address, tenant_senders.name
FROM tenant_senders
WHERE tenant_senders.tenant_id IN (:tenant_id_1) AND lower(tenant_senders.address) IN (:lower_1);
-- step 2 of 9
SELECT suppressions.tenant_id, suppressions.email
FROM suppressions
WHERE suppressions.tenant_id IN (:tenant_id_1) AND suppressions.email IN (:email_1);
-- step 3 of 9
INSERT INTO outbox_messages (id, tenant_id, idempotency_key, to_address, to_name, from_address,
    subject, template_name, template_data, headers, tags, metadata, status, attempt_count,
    max_attempts, next_attempt_at, created_at, updated_at, claim_token, claimed_by, claimed_at,
    lease_expires_at, provider, provider_message_id, last_error, sent_at, ambiguous_since, carried,
    expires_at, priority, claim_order_at, attachment_count, bulk, template_version_id,
    template_version, template_locale)
VALUES (:id, :tenant_id, :idempotency_key, :to_address, :to_name, :from_address, :subject,
    :template_name, :template_data, :headers, :tags, :metadata, :status, :attempt_count,
    :max_attempts, :next_attempt_at, :created_at, :updated_at, :claim_token, :claimed_by,
    :claimed_at, :lease_expires_at, :provider, :provider_message_id, :last_error, :sent_at,
    :ambiguous_since, :carried, :expires_at, :priority, :claim_order_at, :attachment_count, :bulk,
    :template_version_id, :template_version, :template_locale)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING;  -- once per row (executemany)
-- step 4 of 9
SELECT outbox_messages.id
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1);
-- step 5 of 9
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key,
    outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address,
    outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data,
    outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status,
    outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at,
    outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token,
    outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at,
    outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error,
    outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried,
    outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at,
    outbox_messages.attachment_count, outbox_messages.bulk, outbox_messages.template_version_id,
    outbox_messages.template_version, outbox_messages.template_locale
FROM outbox_messages
WHERE outbox_messages.tenant_id = :tenant_id
    AND outbox_messages.idempotency_key IN (:idempotency_key_1);
-- step 6 of 9
SELECT attachments.sha256
FROM attachments
WHERE attachments.sha256 IN (:sha256_1);
-- step 7 of 9
INSERT INTO attachments (sha256, size, content, created_at)
VALUES (:sha256, :size, :content, :created_at)
ON CONFLICT (sha256) DO NOTHING;  -- once per row (executemany)
-- step 8 of 9
INSERT INTO message_attachments (message_id, position, sha256, filename, content_type, content_id)
VALUES (:message_id, :position, :sha256, :filename, :content_type, :content_id);
-- once per row (executemany)
-- step 9 of 9
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)


-- === first_use =============================================================================

-- name: first_use.message --
-- A key's first use by POST /v1/messages: its record, the message and the message's history row,
-- unless the recipient is suppressed or the key taken.
-- step 1 of 4
SELECT NOT (EXISTS (SELECT suppressions.id
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id
    AND suppressions.email IN (:address, :hashed))) AS not_suppressed;
-- step 2 of 4
INSERT INTO idempotency_records (tenant_id, idempotency_key, operation, fingerprint, resource_id,
    response_status, response_body, created_at, expires_at)
VALUES (:record_tenant_id, :record_idempotency_key, :record_operation, :record_fingerprint,
    :record_resource_id, :record_response_status, :record_response_body, :record_created_at,
    :record_expires_at)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING 1;
-- step 3 of 4
INSERT INTO outbox_messages (id, tenant_id, idempotency_key, to_address, to_name, subject,
    template_name, template_data, headers, tags, metadata, status, attempt_count, max_attempts,
    next_attempt_at, created_at, updated_at, last_error, carried, expires_at, priority,
    claim_order_at, attachment_count, bulk, template_version_id, template_version, template_locale)
VALUES (:message_id, :message_tenant_id, :message_idempotency_key, :message_to_address,
    :message_to_name, :message_subject, :message_template_name, :message_template_data,
    :message_headers, :message_tags, :message_metadata, :message_status, :message_attempt_count,
    :message_max_attempts, :message_next_attempt_at, :message_created_at, :message_updated_at,
    :message_last_error, :message_carried, :message_expires_at, :message_priority,
    :message_claim_order_at, :message_attachment_count, :message_bulk, :message_template_version_id,
    :message_template_version, :message_template_locale);
-- step 4 of 4
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_history_message_id, :message_history_from_status, :message_history_to_status,
    :message_history_at, :message_history_actor, :message_history_attempt,
    :message_history_provider_message_id, :message_history_detail);

-- name: first_use.verification --
-- A key's first use by POST /v1/email-verifications: under the tenant's send lock, its record, the
-- verification and its two moves' history, the send and its count, and its email with the email's
-- history row, if the address may be sent a verification now.
-- step 1 of 11
SELECT NOT (EXISTS (SELECT suppressions.id
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id
    AND suppressions.email IN (:address, :hashed))) AS not_suppressed;
-- step 2 of 11
SELECT NOT (EXISTS (SELECT email_verifications.id
FROM email_verifications
WHERE email_verifications.tenant_id = :tenant_id AND email_verifications.email = :email
    AND email_verifications.state IN ('created', 'send_failed', 'send_pending',
    'sent'))) AS no_unfinished;
-- step 3 of 11
SELECT (SELECT count(*) AS count_1
FROM verification_sends
WHERE verification_sends.tenant_id = :tenant_id AND verification_sends.at > :since
    AND verification_sends.email = :email) < :per_email AS email_under_limit;
-- step 4 of 11
SELECT (SELECT coalesce(sum(verification_send_counts.n), 0) AS coalesce_1
FROM verification_send_counts
WHERE verification_send_counts.tenant_id = :tenant_id
    AND verification_send_counts.minute >= :since_minute) < :per_tenant AS tenant_under_limit;
-- step 5 of 11
INSERT INTO idempotency_records (tenant_id, idempotency_key, operation, fingerprint, resource_id,
    response_status, response_body, created_at, expires_at)
VALUES (:record_tenant_id, :record_idempotency_key, :record_operation, :record_fingerprint,
    :record_resource_id, :record_response_status, :record_response_body, :record_created_at,
    :record_expires_at)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING 1;
-- step 6 of 11
INSERT INTO email_verifications (id, tenant_id, email, state, token_digest, expires_at,
    confirm_attempts, send_count, message_id, template_name, redirect_url, locale, created_at,
    updated_at, sent_at, verified_at)
VALUES (:verification_id, :verification_tenant_id, :verification_email, :verification_state,
    :verification_token_digest, :verification_expires_at, :verification_confirm_attempts,
    :verification_send_count, :verification_message_id, :verification_template_name,
    :verification_redirect_url, :verification_locale, :verification_created_at,
    :verification_updated_at, :verification_sent_at, :verification_verified_at);
-- step 7 of 11
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:moves_1_verification_id, :moves_1_from_state, :moves_1_to_state, :moves_1_at,
    :moves_1_actor, :moves_1_message_id, :moves_1_detail),
    (:moves_2_verification_id, :moves_2_from_state, :moves_2_to_state, :moves_2_at, :moves_2_actor,
    :moves_2_message_id, :moves_2_detail);
-- step 8 of 11
INSERT INTO verification_sends (tenant_id, email, verification_id, at)
VALUES (:send_tenant_id, :send_email, :send_verification_id, :send_at);
-- step 9 of 11
INSERT INTO verification_send_counts (tenant_id, minute, n)
VALUES (:counted_tenant_id, :counted_minute, :counted_n)
ON CONFLICT (tenant_id, minute)
DO UPDATE SET n = (verification_send_counts.n + excluded.n);
-- step 10 of 11
INSERT INTO outbox_messages (id, tenant_id, idempotency_key, to_address, to_name, subject,
    template_name, template_data, headers, tags, metadata, status, attempt_count, max_attempts,
    next_attempt_at, created_at, updated_at, last_error, carried, expires_at, priority,
    claim_order_at, attachment_count, bulk, template_version_id, template_version, template_locale)
VALUES (:message_id, :message_tenant_id, :message_idempotency_key, :message_to_address,
    :message_to_name, :message_subject, :message_template_name, :message_template_data,
    :message_headers, :message_tags, :message_metadata, :message_status, :message_attempt_count,
    :message_max_attempts, :message_next_attempt_at, :message_created_at, :message_updated_at,
    :message_last_error, :message_carried, :message_expires_at, :message_priority,
    :message_claim_order_at, :message_attachment_count, :message_bulk, :message_template_version_id,
    :message_template_version, :message_template_locale);
-- step 11 of 11
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_history_message_id, :message_history_from_status, :message_history_to_status,
    :message_history_at, :message_history_actor, :message_history_attempt,
    :message_history_provider_message_id, :message_history_detail);


-- === dispatch ==============================================================================

-- name: dispatch.claim --
-- Take up to `limit` due messages under one fresh claim token, shared fairly among the lanes with
-- due mail (store/fair.py: each tenant's transactional mail, and its bulk mail), each lane in claim
-- order: due time less the priority's head start (content.HEAD_START), so higher priority goes
-- first without starving the rest.
-- step 1 of 5
WITH RECURSIVE lane_tenants(tenant_id) AS
(SELECT (SELECT outbox_messages.tenant_id
FROM outbox_messages
WHERE outbox_messages.status IN ('pending', 'retrying')
ORDER BY outbox_messages.tenant_id, outbox_messages.bulk, outbox_messages.claim_order_at
LIMIT :limit OFFSET :offset) AS tenant_id UNION ALL SELECT (SELECT outbox_messages.tenant_id
FROM outbox_messages
WHERE outbox_messages.status IN ('pending', 'retrying')
    AND outbox_messages.tenant_id > lane_tenants.tenant_id
ORDER BY outbox_messages.tenant_id, outbox_messages.bulk, outbox_messages.claim_order_at
LIMIT :limit_2 OFFSET :offset_2) AS anon_1
FROM lane_tenants
WHERE lane_tenants.tenant_id IS NOT NULL)
SELECT lane_parts.tenant_id, lane_parts.bulk, lane_parts.part + CASE
    WHEN (lane_parts.rank <= :share - sum(lane_parts.part) OVER ()) THEN :share_2
    ELSE :share_3 END AS share
FROM (SELECT lanes.tenant_id AS tenant_id, lanes.bulk AS bulk,
    (:part * CASE WHEN lanes.bulk THEN :part_2 ELSE :part_3 END) / sum(CASE WHEN lanes.bulk THEN
    :part_2 ELSE :part_3 END) OVER () AS part, row_number() OVER (ORDER BY lanes.head_at,
    lanes.tenant_id, lanes.bulk) AS rank
FROM (SELECT lane_tenants.tenant_id AS tenant_id, :bulk AS bulk,
    (SELECT outbox_messages.claim_order_at
FROM outbox_messages
WHERE outbox_messages.bulk = 0 AND outbox_messages.tenant_id = lane_tenants.tenant_id
    AND outbox_messages.status IN ('pending', 'retrying')
    AND outbox_messages.claim_order_at <= :claim_order_at
    AND outbox_messages.next_attempt_at <= :next_attempt_at
ORDER BY outbox_messages.claim_order_at
LIMIT :limit_3 OFFSET :offset_3) AS head_at
FROM lane_tenants
WHERE lane_tenants.tenant_id IS NOT NULL
UNION ALL
SELECT lane_tenants.tenant_id AS tenant_id, :bulk_2 AS bulk, (SELECT outbox_messages.claim_order_at
FROM outbox_messages
WHERE outbox_messages.bulk = 1 AND outbox_messages.tenant_id = lane_tenants.tenant_id
    AND outbox_messages.status IN ('pending', 'retrying')
    AND outbox_messages.claim_order_at <= :claim_order_at
    AND outbox_messages.next_attempt_at <= :next_attempt_at
ORDER BY outbox_messages.claim_order_at
LIMIT :limit_4 OFFSET :offset_4) AS head_at
FROM lane_tenants
WHERE lane_tenants.tenant_id IS NOT NULL) AS lanes
WHERE lanes.head_at IS NOT NULL) AS lane_parts;
-- step 2 of 5
SELECT anon_1.id, anon_1.previous_state, anon_1.order_at, anon_1.lane
FROM (SELECT outbox_messages.id AS id, outbox_messages.status AS previous_state,
    outbox_messages.claim_order_at AS order_at, :lane AS lane
FROM outbox_messages
WHERE outbox_messages.tenant_id = :tenant_id AND outbox_messages.bulk = 0
    AND outbox_messages.status IN ('pending', 'retrying')
    AND outbox_messages.claim_order_at <= :claim_order_at
    AND outbox_messages.next_attempt_at <= :next_attempt_at
ORDER BY outbox_messages.claim_order_at, outbox_messages.id
LIMIT :limit OFFSET :offset) AS anon_1;
-- step 3 of 5
UPDATE outbox_messages
SET status='processing', updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by,
    claimed_at=:claimed_at, lease_expires_at=:lease_expires_at
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('pending', 'retrying')
    AND outbox_messages.claim_order_at <= :claim_order_at
    AND outbox_messages.next_attempt_at <= :next_attempt_at
RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name,
    template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at,
    created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider,
    provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority,
    claim_order_at, attachment_count, bulk, template_version_id, template_version, template_locale;
-- step 4 of 5
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)
-- step 5 of 5
SELECT message_attachments.message_id, message_attachments.filename,
    message_attachments.content_type, attachments.size, message_attachments.sha256,
    message_attachments.content_id
FROM message_attachments JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id IN (:message_id_1)
ORDER BY message_attachments.message_id, message_attachments.position;

-- name: dispatch.release_unconfirmed --
-- Hand back, unsent and with no attempt spent, what claims under `tokens` still hold: claims whose
-- COMMIT went through while their worker heard an error, so the worker never had those messages and
-- nobody sent them.
-- step 1 of 6
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.claim_token IN (:claim_token_1);
-- step 2 of 6
UPDATE outbox_messages
SET status=CASE WHEN (outbox_messages.attempt_count = :attempt_count) THEN 'pending'
    ELSE 'retrying' END, updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by,
    claimed_at=:claimed_at, lease_expires_at=:lease_expires_at
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('processing')
    AND outbox_messages.claim_token IN (:claim_token_2_1)
RETURNING id, tenant_id, status, attempt_count, template_name, metadata, provider_message_id,
    last_error, claimed_by, to_address, provider;
-- step 3 of 6
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)
-- step 4 of 6
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_failed')
    AND email_verifications.message_id IN (:message_id_1);
-- step 5 of 6
UPDATE email_verifications
SET state='send_pending', updated_at=:updated_at
WHERE email_verifications.id IN (:id_1) AND email_verifications.state IN ('send_failed')
    AND email_verifications.message_id IN (:message_id_1)
RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count,
    message_id, template_name, redirect_url, locale, created_at, updated_at, sent_at, verified_at;
-- step 6 of 6
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)

-- name: dispatch.extend_lease --
-- Push the lease of messages still in flight; not a transition, so no event.
UPDATE outbox_messages
SET updated_at=:updated_at, lease_expires_at=:lease_expires_at
WHERE outbox_messages.id IN (:id_1, :id_2) AND outbox_messages.claim_token = :claim_token
    AND outbox_messages.status = :status;

-- name: dispatch.finalize --
-- Record what the worker decided about claimed messages (by message id), only where the claim is
-- still ours.
-- step 1 of 13
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.id IN (:id_1)
    AND outbox_messages.claim_token = :claim_token;
-- step 2 of 13
UPDATE outbox_messages
SET status='sent', attempt_count=(outbox_messages.attempt_count + :attempt_count),
    updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by,
    claimed_at=:claimed_at, lease_expires_at=:lease_expires_at, provider=:provider,
    provider_message_id=:provider_message_id, last_error=:last_error, sent_at=:sent_at,
    ambiguous_since=:ambiguous_since
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('processing')
    AND outbox_messages.id IN (:id_2_1) AND outbox_messages.claim_token = :claim_token_2
RETURNING id, tenant_id, status, attempt_count, template_name, metadata, provider_message_id,
    last_error, claimed_by, to_address, provider;
-- step 3 of 13
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)
-- step 4 of 13
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending')
    AND email_verifications.message_id IN (:message_id_1);
-- step 5 of 13
UPDATE email_verifications
SET state='sent', updated_at=:updated_at, sent_at=:sent_at
WHERE email_verifications.id IN (:id_1) AND email_verifications.state IN ('send_pending')
    AND email_verifications.message_id IN (:message_id_1)
RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count,
    message_id, template_name, redirect_url, locale, created_at, updated_at, sent_at, verified_at;
-- step 6 of 13
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)
-- step 7 of 13
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1) AND hook_endpoints.enabled = 1;
-- step 8 of 13
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing') AND outbox_messages.id IN (:id_1)
    AND outbox_messages.claim_token = :claim_token;
-- step 9 of 13
UPDATE outbox_messages
SET status='retrying', attempt_count=(outbox_messages.attempt_count + :attempt_count),
    next_attempt_at=:next_attempt_at, updated_at=:updated_at, claim_token=:claim_token,
    claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at,
    provider=:provider, last_error=:last_error, ambiguous_since=:ambiguous_since,
    claim_order_at=CASE outbox_messages.priority WHEN :priority THEN :claim_order_at
    WHEN :priority_2 THEN :claim_order_at_2 ELSE :claim_order_at_3 END
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('processing')
    AND outbox_messages.id IN (:id_2_1) AND outbox_messages.claim_token = :claim_token_2
RETURNING id, tenant_id, status, attempt_count, template_name, metadata, provider_message_id,
    last_error, claimed_by, to_address, provider;
-- step 10 of 13
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)
-- step 11 of 13
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending')
    AND email_verifications.message_id IN (:message_id_1);
-- step 12 of 13
UPDATE email_verifications
SET state='sent', updated_at=:updated_at, sent_at=:sent_at
WHERE email_verifications.id IN (:id_1) AND email_verifications.state IN ('send_pending')
    AND email_verifications.message_id IN (:message_id_1)
RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count,
    message_id, template_name, redirect_url, locale, created_at, updated_at, sent_at, verified_at;
-- step 13 of 13
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)

-- name: dispatch.sweep_expired --
-- Expired leases become `unknown`, never a blind resend.
-- step 1 of 4
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('processing')
    AND outbox_messages.lease_expires_at < :lease_expires_at
ORDER BY outbox_messages.lease_expires_at, outbox_messages.id
LIMIT :limit OFFSET :offset;
-- step 2 of 4
UPDATE outbox_messages
SET status='unknown', attempt_count=(outbox_messages.attempt_count + :attempt_count),
    updated_at=:updated_at, claim_token=:claim_token, lease_expires_at=:lease_expires_at,
    last_error=:last_error
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('processing')
    AND outbox_messages.lease_expires_at < :lease_expires_at_2
RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name,
    template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at,
    created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider,
    provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority,
    claim_order_at, attachment_count, bulk, template_version_id, template_version, template_locale;
-- step 3 of 4
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)
-- step 4 of 4
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1) AND hook_endpoints.enabled = 1;

-- name: dispatch.expired_before --
-- Which of these messages had a lease expire more than once (the alert's signal).
SELECT message_events.message_id
FROM message_events
WHERE message_events.message_id IN (:message_id_1, :message_id_2)
    AND message_events.from_status = :from_status AND message_events.to_status = :to_status
    AND message_events.actor != :actor AND message_events.detail LIKE :detail
GROUP BY message_events.message_id
HAVING count(*) > :count;


-- === operator ==============================================================================

-- name: operator.requeue --
-- Send `unknown` or `dead` messages again, with a fresh attempt budget.
-- step 1 of 6
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('dead', 'unknown') AND outbox_messages.status = :status
    AND outbox_messages.tenant_id = :tenant_id
ORDER BY outbox_messages.id
LIMIT :limit OFFSET :offset;
-- step 2 of 6
UPDATE outbox_messages
SET status='pending', max_attempts=(outbox_messages.attempt_count + :attempt_count),
    next_attempt_at=:next_attempt_at, updated_at=:updated_at, claim_token=:claim_token,
    claimed_by=:claimed_by, claimed_at=:claimed_at, lease_expires_at=:lease_expires_at,
    ambiguous_since=:ambiguous_since, claim_order_at=CASE outbox_messages.priority
    WHEN :priority THEN :claim_order_at WHEN :priority_2 THEN :claim_order_at_2
    ELSE :claim_order_at_3 END
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('dead', 'unknown')
    AND outbox_messages.status = :status AND outbox_messages.tenant_id = :tenant_id
RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name,
    template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at,
    created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider,
    provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority,
    claim_order_at, attachment_count, bulk, template_version_id, template_version, template_locale;
-- step 3 of 6
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)
-- step 4 of 6
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_failed')
    AND email_verifications.message_id IN (:message_id_1);
-- step 5 of 6
UPDATE email_verifications
SET state='send_pending', updated_at=:updated_at
WHERE email_verifications.id IN (:id_1) AND email_verifications.state IN ('send_failed')
    AND email_verifications.message_id IN (:message_id_1)
RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count,
    message_id, template_name, redirect_url, locale, created_at, updated_at, sent_at, verified_at;
-- step 6 of 6
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)

-- name: operator.cancel --
-- Withdraw pending messages (never one a worker holds or already tried).
-- step 1 of 3
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('pending') AND outbox_messages.id IN (:id_1)
    AND outbox_messages.tenant_id = :tenant_id;
-- step 2 of 3
UPDATE outbox_messages
SET status='cancelled', updated_at=:updated_at
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('pending')
    AND outbox_messages.id IN (:id_2_1) AND outbox_messages.tenant_id = :tenant_id
RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name,
    template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at,
    created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider,
    provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority,
    claim_order_at, attachment_count, bulk, template_version_id, template_version, template_locale;
-- step 3 of 3
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)

-- name: operator.resolve --
-- Settle an `unknown` message from evidence: it was accepted (sent) or it was not (failed).
-- step 1 of 7
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('unknown') AND outbox_messages.id = :id;
-- step 2 of 7
UPDATE outbox_messages
SET status='sent', updated_at=:updated_at, provider_message_id=:provider_message_id,
    sent_at=:sent_at, ambiguous_since=:ambiguous_since
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('unknown')
    AND outbox_messages.id = :id_2
RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name,
    template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at,
    created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider,
    provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority,
    claim_order_at, attachment_count, bulk, template_version_id, template_version, template_locale;
-- step 3 of 7
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)
-- step 4 of 7
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending')
    AND email_verifications.message_id IN (:message_id_1);
-- step 5 of 7
UPDATE email_verifications
SET state='sent', updated_at=:updated_at, sent_at=:sent_at
WHERE email_verifications.id IN (:id_1) AND email_verifications.state IN ('send_pending')
    AND email_verifications.message_id IN (:message_id_1)
RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count,
    message_id, template_name, redirect_url, locale, created_at, updated_at, sent_at, verified_at;
-- step 6 of 7
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)
-- step 7 of 7
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1) AND hook_endpoints.enabled = 1;

-- name: operator.flag --
-- Mark an unknown message as waiting for an operator, once per stay in `unknown`.
-- step 1 of 3
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('unknown') AND outbox_messages.id = :id AND NOT (EXISTS (SELECT *
FROM message_events
WHERE message_events.message_id = outbox_messages.id AND message_events.from_status = :from_status
    AND message_events.to_status = :to_status AND message_events.at >= outbox_messages.updated_at));
-- step 2 of 3
UPDATE outbox_messages
SET status='unknown', updated_at=:updated_at
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('unknown')
    AND outbox_messages.id = :id_2 AND NOT (EXISTS (SELECT *
FROM message_events
WHERE message_events.message_id = outbox_messages.id AND message_events.from_status = :from_status
    AND message_events.to_status = :to_status
    AND message_events.at >= outbox_messages.updated_at)) RETURNING id, tenant_id, idempotency_key,
    to_address, to_name, from_address, subject, template_name, template_data, headers, tags,
    metadata, status, attempt_count, max_attempts, next_attempt_at, created_at, updated_at,
    claim_token, claimed_by, claimed_at, lease_expires_at, provider, provider_message_id,
    last_error, sent_at, ambiguous_since, carried, expires_at, priority, claim_order_at,
    attachment_count, bulk, template_version_id, template_version, template_locale;
-- step 3 of 3
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)

-- name: operator.purge --
-- Delete up to `limit` terminal messages (their events and attachment references too) last changed
-- before a cutoff: of one tenant (`tenant_id`), or of every tenant but those `other_than` names
-- (the tenants that keep their own PURGE_AFTER_DAYS).
-- step 1 of 4
SELECT outbox_messages.id
FROM outbox_messages
WHERE outbox_messages.status IN ('cancelled', 'dead', 'expired', 'failed', 'sent')
    AND outbox_messages.updated_at < :updated_at
ORDER BY outbox_messages.updated_at
LIMIT :limit OFFSET :offset;
-- step 2 of 4
DELETE FROM message_events WHERE message_events.message_id IN (:message_id_1);
-- step 3 of 4
DELETE FROM message_attachments WHERE message_attachments.message_id IN (:message_id_1);
-- step 4 of 4
DELETE
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1)
    AND outbox_messages.status IN ('cancelled', 'dead', 'expired', 'failed', 'sent')
    AND outbox_messages.updated_at < :updated_at;


-- === attachments ===========================================================================

-- name: attachments.refs --
-- The attachments of these messages, in order, without their bytes (messages without any are left
-- out).
SELECT message_attachments.message_id, message_attachments.filename,
    message_attachments.content_type, attachments.size, message_attachments.sha256,
    message_attachments.content_id
FROM message_attachments JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id IN (:message_id_1, :message_id_2)
ORDER BY message_attachments.message_id, message_attachments.position;

-- name: attachments.contents --
-- The bytes of these attachments, by SHA-256 (what a worker sends).
SELECT attachments.sha256, attachments.content
FROM attachments
WHERE attachments.sha256 IN (:sha256_1);

-- name: attachments.content --
-- One attachment of a message with its bytes, by its index in the message (the console's download);
-- None if the message has no such attachment.
SELECT message_attachments.filename, message_attachments.content_type, attachments.size,
    message_attachments.sha256, message_attachments.content_id, attachments.content
FROM message_attachments JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id = :message_id AND message_attachments.position = :position;

-- name: attachments.purge_unreferenced --
-- Delete up to `limit` attachments no message references any more.
-- step 1 of 2
SELECT attachments.sha256
FROM attachments
WHERE NOT (EXISTS (SELECT *
FROM message_attachments
WHERE message_attachments.sha256 = attachments.sha256))
LIMIT :limit OFFSET :offset;
-- step 2 of 2
DELETE FROM attachments WHERE attachments.sha256 IN (:sha256_1) AND NOT (EXISTS (SELECT *
FROM message_attachments
WHERE message_attachments.sha256 = attachments.sha256));


-- === senders ===============================================================================

-- name: senders.add --
-- Let a tenant send from an address; False if it already could (its name is kept).
-- step 1 of 2
SELECT tenant_senders.address
FROM tenant_senders
WHERE tenant_senders.tenant_id = :tenant_id AND lower(tenant_senders.address) = :lower;
-- step 2 of 2
INSERT INTO tenant_senders (tenant_id, address, name, created_at)
VALUES (:tenant_id, :address, :name, :created_at)
ON CONFLICT DO NOTHING;

-- name: senders.remove --
-- Take an address from a tenant's identities; False if it was not one.
DELETE
FROM tenant_senders
WHERE tenant_senders.tenant_id = :tenant_id AND lower(tenant_senders.address) = :lower;

-- name: senders.listing --
-- A tenant's sender identities, by address.
SELECT tenant_senders.tenant_id, tenant_senders.address, tenant_senders.name,
    tenant_senders.created_at
FROM tenant_senders
WHERE tenant_senders.tenant_id = :tenant_id ORDER BY tenant_senders.address;

-- name: senders.owned --
-- Which of these (tenant, address) pairs are sender identities, with their names; keys hold the
-- address in lower case.
SELECT tenant_senders.tenant_id, tenant_senders.address, tenant_senders.name
FROM tenant_senders
WHERE tenant_senders.tenant_id IN (:tenant_id_1) AND lower(tenant_senders.address) IN (:lower_1);


-- === tenant_accounts =======================================================================

-- name: tenant_accounts.put --
-- Give a tenant its own account, or replace the one it has (its creation time stays); True when it
-- had none.
-- step 1 of 2
SELECT tenant_accounts.tenant_id
FROM tenant_accounts
WHERE tenant_accounts.tenant_id = :tenant_id;
-- step 2 of 2
INSERT INTO tenant_accounts (tenant_id, kind, sealed_settings, created_at, updated_at, updated_by)
VALUES (:tenant_id, :kind, :sealed_settings, :created_at, :updated_at, :updated_by)
ON CONFLICT (tenant_id)
DO UPDATE
SET kind = :kind_2, sealed_settings = :sealed_settings_2, updated_at = :updated_at_2,
    updated_by = :updated_by_2;

-- name: tenant_accounts.remove --
-- Take a tenant's own account away; False if it had none.
DELETE FROM tenant_accounts WHERE tenant_accounts.tenant_id = :tenant_id;

-- name: tenant_accounts.sealed_one --
-- A tenant's own account, its settings sealed; None if it has none.
SELECT tenant_accounts.tenant_id, tenant_accounts.kind, tenant_accounts.sealed_settings,
    tenant_accounts.created_at, tenant_accounts.updated_at, tenant_accounts.updated_by
FROM tenant_accounts
WHERE tenant_accounts.tenant_id = :tenant_id;

-- name: tenant_accounts.listing --
-- Every tenant's own account, by tenant id, without its settings.
SELECT tenant_accounts.tenant_id, tenant_accounts.kind, tenant_accounts.created_at,
    tenant_accounts.updated_at, tenant_accounts.updated_by
FROM tenant_accounts ORDER BY tenant_accounts.tenant_id;

-- name: tenant_accounts.sealed_all --
-- Every tenant's own account with its settings sealed, by tenant id (what a worker reads to build
-- each tenant's provider).
SELECT tenant_accounts.tenant_id, tenant_accounts.kind, tenant_accounts.sealed_settings,
    tenant_accounts.created_at, tenant_accounts.updated_at, tenant_accounts.updated_by
FROM tenant_accounts ORDER BY tenant_accounts.tenant_id;


-- === messages ==============================================================================

-- name: messages.get --
-- One message, with its attachments (references, not bytes).
-- step 1 of 2
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key,
    outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address,
    outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data,
    outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status,
    outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at,
    outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token,
    outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at,
    outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error,
    outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried,
    outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at,
    outbox_messages.attachment_count, outbox_messages.bulk, outbox_messages.template_version_id,
    outbox_messages.template_version, outbox_messages.template_locale
FROM outbox_messages
WHERE outbox_messages.id = :id AND outbox_messages.tenant_id = :tenant_id;
-- step 2 of 2
SELECT message_attachments.message_id, message_attachments.filename,
    message_attachments.content_type, attachments.size, message_attachments.sha256,
    message_attachments.content_id
FROM message_attachments JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id IN (:message_id_1)
ORDER BY message_attachments.message_id, message_attachments.position;

-- name: messages.page --
-- Newest first (ids are time-ordered), up to `limit`, and whether more follow; with their
-- attachments (references, not bytes).
-- step 1 of 2
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key,
    outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address,
    outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data,
    outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status,
    outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at,
    outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token,
    outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at,
    outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error,
    outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried,
    outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at,
    outbox_messages.attachment_count, outbox_messages.bulk, outbox_messages.template_version_id,
    outbox_messages.template_version, outbox_messages.template_locale
FROM outbox_messages
WHERE outbox_messages.status = :status AND outbox_messages.tenant_id = :tenant_id
    AND lower(outbox_messages.to_address) = :address AND outbox_messages.id < :id
ORDER BY outbox_messages.id DESC
LIMIT :limit OFFSET :offset;
-- step 2 of 2
SELECT message_attachments.message_id, message_attachments.filename,
    message_attachments.content_type, attachments.size, message_attachments.sha256,
    message_attachments.content_id
FROM message_attachments JOIN attachments ON attachments.sha256 = message_attachments.sha256
WHERE message_attachments.message_id IN (:message_id_1)
ORDER BY message_attachments.message_id, message_attachments.position;

-- name: messages.events --
-- A message's history, oldest first.
SELECT message_events.id, message_events.message_id, message_events.from_status,
    message_events.to_status, message_events.at, message_events.actor, message_events.attempt,
    message_events.provider_message_id, message_events.detail
FROM message_events
WHERE message_events.message_id = :message_id ORDER BY message_events.id;

-- name: messages.count_by_status --
-- How many messages are in each status.
SELECT outbox_messages.status, count(*) AS n
FROM outbox_messages GROUP BY outbox_messages.status;


-- === stats =================================================================================

-- name: stats.oldest_due --
-- When the longest-waiting claimable message became due (None: nothing is waiting).
SELECT min(outbox_messages.claim_order_at) AS min_1
FROM outbox_messages
WHERE outbox_messages.status IN (:status_1, :status_2)
    AND outbox_messages.claim_order_at <= :claim_order_at;

-- name: stats.outbox_gauges --
-- The scrape's numbers: capped counts in one statement (each a range of an index that leads with
-- the filtered column), then `oldest_due`'s two short index ranges.
-- step 1 of 2
SELECT (SELECT count(*) AS count_1
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status
LIMIT :limit OFFSET :offset) AS anon_1) AS pending, (SELECT count(*) AS count_2
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_2
LIMIT :limit_2 OFFSET :offset_2) AS anon_2) AS processing, (SELECT count(*) AS count_3
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_3
LIMIT :limit_3 OFFSET :offset_3) AS anon_3) AS retrying, (SELECT count(*) AS count_4
FROM (SELECT 1
FROM outbox_messages
WHERE outbox_messages.status = :status_4
LIMIT :limit_4 OFFSET :offset_4) AS anon_4) AS unknown, (SELECT count(*) AS count_5
FROM (SELECT 1
FROM provider_events
WHERE provider_events.message_id IS NULL
LIMIT :limit_5 OFFSET :offset_5) AS anon_5) AS unmatched;
-- step 2 of 2
SELECT min(outbox_messages.claim_order_at) AS min_1
FROM outbox_messages
WHERE outbox_messages.status IN (:status_1, :status_2)
    AND outbox_messages.claim_order_at <= :claim_order_at;

-- name: stats.sent_per_bucket --
-- Messages sent per time bucket, oldest first; each a range count on (to_status, at).
-- step 1 of 2
SELECT count(*) AS count_1
FROM message_events
WHERE message_events.to_status = :to_status AND message_events.at >= :at
    AND message_events.at < :at_2;
-- step 2 of 2
SELECT count(*) AS count_1
FROM message_events
WHERE message_events.to_status = :to_status AND message_events.at >= :at
    AND message_events.at < :at_2;

-- name: stats.attempt_endings --
-- How attempts ended since a time: sent, retrying, failed, dead, unknown, released.
SELECT message_events.to_status, count(*) AS n
FROM message_events
WHERE message_events.from_status = :from_status AND message_events.at >= :at
GROUP BY message_events.to_status;

-- name: stats.oldest_unknown --
-- The messages longest in `unknown`, oldest first.
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.to_address,
    outbox_messages.updated_at, outbox_messages.claimed_by
FROM outbox_messages
WHERE outbox_messages.status = :status ORDER BY outbox_messages.updated_at
LIMIT :limit OFFSET :offset;


-- === events ================================================================================

-- name: events.match --
-- Our message for an event: by our id carried in a header or tag, else by the provider's id
-- recorded when it accepted the message.
-- step 1 of 2
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key,
    outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address,
    outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data,
    outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status,
    outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at,
    outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token,
    outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at,
    outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error,
    outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried,
    outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at,
    outbox_messages.attachment_count, outbox_messages.bulk, outbox_messages.template_version_id,
    outbox_messages.template_version, outbox_messages.template_locale
FROM outbox_messages
WHERE outbox_messages.id = :id;
-- step 2 of 2
SELECT outbox_messages.id, outbox_messages.tenant_id, outbox_messages.idempotency_key,
    outbox_messages.to_address, outbox_messages.to_name, outbox_messages.from_address,
    outbox_messages.subject, outbox_messages.template_name, outbox_messages.template_data,
    outbox_messages.headers, outbox_messages.tags, outbox_messages.metadata, outbox_messages.status,
    outbox_messages.attempt_count, outbox_messages.max_attempts, outbox_messages.next_attempt_at,
    outbox_messages.created_at, outbox_messages.updated_at, outbox_messages.claim_token,
    outbox_messages.claimed_by, outbox_messages.claimed_at, outbox_messages.lease_expires_at,
    outbox_messages.provider, outbox_messages.provider_message_id, outbox_messages.last_error,
    outbox_messages.sent_at, outbox_messages.ambiguous_since, outbox_messages.carried,
    outbox_messages.expires_at, outbox_messages.priority, outbox_messages.claim_order_at,
    outbox_messages.attachment_count, outbox_messages.bulk, outbox_messages.template_version_id,
    outbox_messages.template_version, outbox_messages.template_locale
FROM outbox_messages
WHERE outbox_messages.provider_message_id = :provider_message_id
LIMIT :limit OFFSET :offset;

-- name: events.store --
-- Keep the event (raw payload too); None if it was stored before (a resend).
-- step 1 of 3
SELECT provider_events.id
FROM provider_events
WHERE provider_events.dedup_key = :dedup_key;
-- step 2 of 3
INSERT INTO provider_events (provider, dedup_key, kind, bounce_type, provider_event, occurred_at,
    received_at, provider_message_id, message_id, tenant_id, recipient, detail, raw)
VALUES (:provider, :dedup_key, :kind, :bounce_type, :provider_event, :occurred_at, :received_at,
    :provider_message_id, :message_id, :tenant_id, :recipient, :detail, :raw);
-- step 3 of 3
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1) AND hook_endpoints.enabled = 1;

-- name: events.for_message --
-- Every event about one message, oldest first.
SELECT provider_events.id, provider_events.provider, provider_events.dedup_key,
    provider_events.kind, provider_events.bounce_type, provider_events.provider_event,
    provider_events.occurred_at, provider_events.received_at, provider_events.provider_message_id,
    provider_events.message_id, provider_events.tenant_id, provider_events.recipient,
    provider_events.detail, provider_events.raw
FROM provider_events
WHERE provider_events.message_id = :message_id
    OR provider_events.provider_message_id = :provider_message_id
ORDER BY provider_events.occurred_at, provider_events.id;

-- name: events.unmatched_count --
-- How many provider events matched no message.
SELECT count(*) AS count_1
FROM provider_events
WHERE provider_events.message_id IS NULL;


-- === suppressions ==========================================================================

-- name: suppressions.add --
-- Suppress an address; False if it already was (the first reason is kept).
-- step 1 of 2
SELECT suppressions.id
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id AND suppressions.email = :email;
-- step 2 of 2
INSERT INTO suppressions (tenant_id, email, reason, detail, source_event_id, created_at)
VALUES (:tenant_id, :email, :reason, :detail, :source_event_id, :created_at)
ON CONFLICT DO NOTHING;

-- name: suppressions.remove --
-- Send to the address again: its plain entry, or its hashed one if it was erased.
DELETE
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id AND suppressions.email IN (:email_1);

-- name: suppressions.listing --
-- Suppressions, newest first, a page.
SELECT suppressions.id, suppressions.tenant_id, suppressions.email, suppressions.reason,
    suppressions.detail, suppressions.source_event_id, suppressions.created_at
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id
ORDER BY suppressions.created_at DESC, suppressions.id DESC
LIMIT :limit OFFSET :offset;

-- name: suppressions.count --
-- How many addresses are suppressed.
SELECT count(*) AS count_1
FROM suppressions;

-- name: suppressions.among --
-- Which of these (tenant, address) pairs are suppressed (addresses compared in lower case).
SELECT suppressions.tenant_id, suppressions.email
FROM suppressions
WHERE suppressions.tenant_id IN (:tenant_id_1) AND suppressions.email IN (:email_1);


-- === erasure ===============================================================================

-- name: erasure.begin --
-- The unfinished erasure of this address in this scope, or a new one; and the address suppressed,
-- by its hash, for every tenant in scope (a plain suppression of it too).
-- step 1 of 8
SELECT erasures.id, erasures.tenant_id, erasures.address_hash, erasures.state, erasures.progress,
    erasures.requested_at, erasures.requested_by, erasures.updated_at, erasures.finished_at
FROM erasures
WHERE erasures.address_hash = :address_hash AND erasures.tenant_id = :tenant_id
    AND erasures.state != :state
ORDER BY erasures.requested_at
LIMIT :limit OFFSET :offset;
-- step 2 of 8
INSERT INTO erasures (id, tenant_id, address_hash, state, progress, requested_at, requested_by,
    updated_at, finished_at)
VALUES (:id, :tenant_id, :address_hash, :state, :progress, :requested_at, :requested_by,
    :updated_at, :finished_at);
-- step 3 of 8
SELECT erasures.id, erasures.tenant_id, erasures.address_hash, erasures.state, erasures.progress,
    erasures.requested_at, erasures.requested_by, erasures.updated_at, erasures.finished_at
FROM erasures
WHERE erasures.id = :id;
-- step 4 of 8
SELECT suppressions.tenant_id
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id AND lower(suppressions.email) = :lower;
-- step 5 of 8
SELECT suppressions.tenant_id
FROM suppressions
WHERE suppressions.email = :email AND suppressions.tenant_id IN (:tenant_id_1);
-- step 6 of 8
DELETE
FROM suppressions
WHERE suppressions.tenant_id = :tenant_id AND lower(suppressions.email) = :lower
    AND suppressions.tenant_id IN (:tenant_id_2_1);
-- step 7 of 8
UPDATE suppressions
SET email=:email, detail=:detail
WHERE suppressions.tenant_id = :tenant_id AND lower(suppressions.email) = :lower;
-- step 8 of 8
INSERT INTO suppressions (tenant_id, email, reason, detail, source_event_id, created_at)
VALUES (:tenant_id, :email, :reason, :detail, :source_event_id, :created_at)
ON CONFLICT DO NOTHING;  -- once per row (executemany)

-- name: erasure.erase_messages --
-- Erase up to `limit` messages that quote the address and no worker holds; how many.
-- step 1 of 19
SELECT outbox_messages.id
FROM outbox_messages
WHERE outbox_messages.tenant_id = :tenant_id
    AND ((lower(outbox_messages.idempotency_key) LIKE '%' || :lower || '%' ESCAPE '/') OR
    (lower(outbox_messages.to_address) LIKE '%' || :lower_2 || '%' ESCAPE '/') OR
    (lower(outbox_messages.to_name) LIKE '%' || :lower_3 || '%' ESCAPE '/') OR
    (lower(outbox_messages.from_address) LIKE '%' || :lower_4 || '%' ESCAPE '/') OR
    (lower(outbox_messages.subject) LIKE '%' || :lower_5 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.template_data AS TEXT)) LIKE '%' || :lower_6 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.headers AS TEXT)) LIKE '%' || :lower_7 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.tags AS TEXT)) LIKE '%' || :lower_8 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.metadata AS TEXT)) LIKE '%' || :lower_9 || '%' ESCAPE '/') OR
    (lower(outbox_messages.last_error) LIKE '%' || :lower_10 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.carried AS TEXT)) LIKE '%' || :lower_11 || '%' ESCAPE '/'))
    AND outbox_messages.status != :status
ORDER BY outbox_messages.id
LIMIT :limit OFFSET :offset;
-- step 2 of 19
SELECT outbox_messages.id, outbox_messages.status AS previous_state
FROM outbox_messages
WHERE outbox_messages.status IN ('pending', 'retrying') AND outbox_messages.id IN (:id_1);
-- step 3 of 19
UPDATE outbox_messages
SET status='cancelled', updated_at=:updated_at
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status IN ('pending', 'retrying')
    AND outbox_messages.id IN (:id_2_1)
RETURNING id, tenant_id, idempotency_key, to_address, to_name, from_address, subject, template_name,
    template_data, headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at,
    created_at, updated_at, claim_token, claimed_by, claimed_at, lease_expires_at, provider,
    provider_message_id, last_error, sent_at, ambiguous_since, carried, expires_at, priority,
    claim_order_at, attachment_count, bulk, template_version_id, template_version, template_locale;
-- step 4 of 19
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
    provider_message_id, detail)
VALUES (:message_id, :from_status, :to_status, :at, :actor, :attempt, :provider_message_id,
    :detail);  -- once per row (executemany)
-- step 5 of 19
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_failed')
    AND email_verifications.message_id IN (:message_id_1);
-- step 6 of 19
UPDATE email_verifications
SET state='send_pending', updated_at=:updated_at
WHERE email_verifications.id IN (:id_1) AND email_verifications.state IN ('send_failed')
    AND email_verifications.message_id IN (:message_id_1)
RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count,
    message_id, template_name, redirect_url, locale, created_at, updated_at, sent_at, verified_at;
-- step 7 of 19
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)
-- step 8 of 19
SELECT outbox_messages.id
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status != :status;
-- step 9 of 19
UPDATE message_events SET detail=:detail WHERE message_events.message_id IN (:message_id_1);
-- step 10 of 19
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt, detail)
SELECT outbox_messages.id, outbox_messages.status, outbox_messages.status AS status__1,
    :at AS anon_1, :actor AS anon_2, outbox_messages.attempt_count, :detail AS anon_3
FROM outbox_messages
WHERE outbox_messages.id IN (:id_1);
-- step 11 of 19
UPDATE hook_delivery_events
SET detail=:detail
WHERE hook_delivery_events.delivery_id IN (SELECT hook_deliveries.id
FROM hook_deliveries
WHERE hook_deliveries.message_id IN (:message_id_1));
-- step 12 of 19
UPDATE hook_deliveries
SET payload=:payload, last_error=:last_error
WHERE hook_deliveries.message_id IN (:message_id_1);
-- step 13 of 19
UPDATE provider_events
SET recipient=:recipient, detail=:detail, raw=:raw
WHERE provider_events.message_id IN (:message_id_1);
-- step 14 of 19
SELECT message_attachments.sha256
FROM message_attachments
WHERE message_attachments.message_id IN (:message_id_1);
-- step 15 of 19
DELETE FROM message_attachments WHERE message_attachments.message_id IN (:message_id_1);
-- step 16 of 19
DELETE FROM attachments WHERE attachments.sha256 IN (:sha256_1) AND NOT (EXISTS (SELECT *
FROM message_attachments
WHERE message_attachments.sha256 = attachments.sha256));
-- step 17 of 19
UPDATE outbox_messages
SET idempotency_key=:idempotency_key, to_address=:to_address, to_name=:to_name,
    from_address=:from_address, subject=:subject, template_data=:template_data, headers=:headers,
    tags=:tags, metadata=:metadata, last_error=:last_error, carried=:carried,
    attachment_count=:attachment_count
WHERE outbox_messages.id IN (:id_1) AND outbox_messages.status != :status;
-- step 18 of 19
SELECT erasures.progress
FROM erasures
WHERE erasures.id = :id;
-- step 19 of 19
UPDATE erasures
SET state=:state, progress=:progress, updated_at=:updated_at
WHERE erasures.id = :id;

-- name: erasure.erase_rows --
-- Scrub up to `limit` rows of one table that quote the address; how many.
-- step 1 of 4
SELECT email_verifications.id, email_verifications.tenant_id, email_verifications.email,
    email_verifications.state, email_verifications.token_digest, email_verifications.expires_at,
    email_verifications.confirm_attempts, email_verifications.send_count,
    email_verifications.message_id, email_verifications.template_name,
    email_verifications.redirect_url, email_verifications.locale, email_verifications.created_at,
    email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at
FROM email_verifications
WHERE email_verifications.tenant_id = :tenant_id
    AND ((lower(email_verifications.email) LIKE '%' || :lower || '%' ESCAPE '/') OR
    (lower(email_verifications.redirect_url) LIKE '%' || :lower_2 || '%' ESCAPE '/'))
ORDER BY email_verifications.id
LIMIT :limit OFFSET :offset;
-- step 2 of 4
UPDATE email_verifications
SET email=:erased_email, redirect_url=:erased_redirect_url
WHERE email_verifications.id = :erased_key;  -- once per row (executemany)
-- step 3 of 4
SELECT erasures.progress
FROM erasures
WHERE erasures.id = :id;
-- step 4 of 4
UPDATE erasures
SET state=:state, progress=:progress, updated_at=:updated_at
WHERE erasures.id = :id;

-- name: erasure.held_messages --
-- How many messages that quote the address a worker holds right now (left for later).
SELECT count(*) AS count_1
FROM outbox_messages
WHERE ((lower(outbox_messages.idempotency_key) LIKE '%' || :lower || '%' ESCAPE '/') OR
    (lower(outbox_messages.to_address) LIKE '%' || :lower_2 || '%' ESCAPE '/') OR
    (lower(outbox_messages.to_name) LIKE '%' || :lower_3 || '%' ESCAPE '/') OR
    (lower(outbox_messages.from_address) LIKE '%' || :lower_4 || '%' ESCAPE '/') OR
    (lower(outbox_messages.subject) LIKE '%' || :lower_5 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.template_data AS TEXT)) LIKE '%' || :lower_6 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.headers AS TEXT)) LIKE '%' || :lower_7 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.tags AS TEXT)) LIKE '%' || :lower_8 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.metadata AS TEXT)) LIKE '%' || :lower_9 || '%' ESCAPE '/') OR
    (lower(outbox_messages.last_error) LIKE '%' || :lower_10 || '%' ESCAPE '/') OR
    (lower(CAST(outbox_messages.carried AS TEXT)) LIKE '%' || :lower_11 || '%' ESCAPE '/'))
    AND outbox_messages.status = :status;

-- name: erasure.finish --
-- An erasure ends its run: done, or waiting for the messages a worker holds.
-- step 1 of 2
UPDATE erasures
SET state=:state, updated_at=:updated_at, finished_at=:finished_at
WHERE erasures.id = :id;
-- step 2 of 2
SELECT erasures.id, erasures.tenant_id, erasures.address_hash, erasures.state, erasures.progress,
    erasures.requested_at, erasures.requested_by, erasures.updated_at, erasures.finished_at
FROM erasures
WHERE erasures.id = :id;

-- name: erasure.get --
-- One erasure by its id (None if there is none).
SELECT erasures.id, erasures.tenant_id, erasures.address_hash, erasures.state, erasures.progress,
    erasures.requested_at, erasures.requested_by, erasures.updated_at, erasures.finished_at
FROM erasures
WHERE erasures.id = :id;

-- name: erasure.listing --
-- Erasures, newest first.
SELECT erasures.id, erasures.tenant_id, erasures.address_hash, erasures.state, erasures.progress,
    erasures.requested_at, erasures.requested_by, erasures.updated_at, erasures.finished_at
FROM erasures ORDER BY erasures.requested_at DESC, erasures.id DESC
LIMIT :limit OFFSET :offset;


-- === tenant_retention ======================================================================

-- name: tenant_retention.put --
-- Keep this tenant's finished messages this many days (0: never purge them).
INSERT INTO tenant_retention (tenant_id, purge_after_days, updated_at)
VALUES (:tenant_id, :purge_after_days, :updated_at)
ON CONFLICT (tenant_id)
DO UPDATE SET purge_after_days = :purge_after_days_2, updated_at = :updated_at_2;

-- name: tenant_retention.remove --
-- Back to the setting; False if the tenant had no value of its own.
DELETE FROM tenant_retention WHERE tenant_retention.tenant_id = :tenant_id;

-- name: tenant_retention.all_days --
-- Each tenant's own PURGE_AFTER_DAYS, by tenant id (the tenants without one: absent).
SELECT tenant_retention.tenant_id, tenant_retention.purge_after_days
FROM tenant_retention;


-- === templates =============================================================================

-- name: templates.publish --
-- Write the next version of (name, locale) and make it current; the first locale a template is
-- published in becomes its default.
-- step 1 of 5
INSERT INTO templates (tenant_id, name, default_locale, created_at)
VALUES (:tenant_id, :name, :default_locale, :created_at)
ON CONFLICT DO NOTHING;
-- step 2 of 5
SELECT coalesce(max(template_versions.version), :coalesce) AS coalesce_1
FROM template_versions
WHERE template_versions.tenant_id = :tenant_id AND template_versions.name = :name
    AND template_versions.locale = :locale;
-- step 3 of 5
INSERT INTO template_versions (id, tenant_id, name, locale, version, format, subject, html, text,
    compiled_html, sample_data, dependencies, changed_by, created_at)
VALUES (:id, :tenant_id, :name, :locale, :version, :format, :subject, :html, :text, :compiled_html,
    :sample_data, :dependencies, :changed_by, :created_at);
-- step 4 of 5
INSERT INTO template_locales (tenant_id, name, locale, current_version, current_version_id,
    latest_version, updated_at)
VALUES (:tenant_id, :name, :locale, :current_version, :current_version_id, :latest_version,
    :updated_at)
ON CONFLICT DO NOTHING;
-- step 5 of 5
UPDATE template_locales
SET current_version=:current_version, current_version_id=:current_version_id,
    latest_version=:latest_version, updated_at=:updated_at
WHERE template_locales.tenant_id = :tenant_id AND template_locales.name = :name
    AND template_locales.locale = :locale AND template_locales.latest_version < :latest_version_2;

-- name: templates.rollback --
-- Make an existing version current again (None: there is no such version).
-- step 1 of 2
SELECT template_versions.id, template_versions.tenant_id, template_versions.name,
    template_versions.locale, template_versions.version, template_versions.format,
    template_versions.subject, template_versions.html, template_versions.text,
    template_versions.compiled_html, template_versions.sample_data, template_versions.dependencies,
    template_versions.changed_by, template_versions.created_at
FROM template_versions
WHERE template_versions.tenant_id = :tenant_id AND template_versions.name = :name
    AND template_versions.locale = :locale AND template_versions.version = :version;
-- step 2 of 2
UPDATE template_locales
SET current_version=:current_version, current_version_id=:current_version_id, updated_at=:updated_at
WHERE template_locales.tenant_id = :tenant_id AND template_locales.name = :name
    AND template_locales.locale = :locale;

-- name: templates.version_of --
-- One version of (name, locale) by its number (None: there is no such version).
SELECT template_versions.id, template_versions.tenant_id, template_versions.name,
    template_versions.locale, template_versions.version, template_versions.format,
    template_versions.subject, template_versions.html, template_versions.text,
    template_versions.compiled_html, template_versions.sample_data, template_versions.dependencies,
    template_versions.changed_by, template_versions.created_at
FROM template_versions
WHERE template_versions.tenant_id = :tenant_id AND template_versions.name = :name
    AND template_versions.locale = :locale AND template_versions.version = :version;

-- name: templates.versions --
-- Every version of (name, locale), oldest first.
SELECT template_versions.id, template_versions.tenant_id, template_versions.name,
    template_versions.locale, template_versions.version, template_versions.format,
    template_versions.subject, template_versions.html, template_versions.text,
    template_versions.compiled_html, template_versions.sample_data, template_versions.dependencies,
    template_versions.changed_by, template_versions.created_at
FROM template_versions
WHERE template_versions.tenant_id = :tenant_id AND template_versions.name = :name
    AND template_versions.locale = :locale
ORDER BY template_versions.version;

-- name: templates.by_ids --
-- The versions with these ids (a worker's pinned messages and what they extend).
SELECT template_versions.id, template_versions.tenant_id, template_versions.name,
    template_versions.locale, template_versions.version, template_versions.format,
    template_versions.subject, template_versions.html, template_versions.text,
    template_versions.compiled_html, template_versions.sample_data, template_versions.dependencies,
    template_versions.changed_by, template_versions.created_at
FROM template_versions
WHERE template_versions.id IN (:id_1, :id_2);

-- name: templates.listing --
-- The tenant's templates (only `names`, if given), by name, with their locales.
SELECT templates.name, templates.default_locale, template_locales.locale,
    template_locales.current_version, template_locales.latest_version, template_locales.updated_at
FROM templates JOIN template_locales ON template_locales.tenant_id = templates.tenant_id
    AND template_locales.name = templates.name
WHERE templates.tenant_id = :tenant_id AND templates.name IN (:name_1)
ORDER BY templates.name, template_locales.locale;

-- name: templates.current_ids --
-- For each (tenant, name) that is a template in the database: its default locale and, by locale,
-- its current version's (number, id).
SELECT templates.tenant_id, templates.name, templates.default_locale, template_locales.locale,
    template_locales.current_version, template_locales.current_version_id
FROM templates JOIN template_locales ON template_locales.tenant_id = templates.tenant_id
    AND template_locales.name = templates.name
WHERE (templates.tenant_id, templates.name) IN (VALUES (:wanted_1_1, :wanted_1_2), (:wanted_2_1,
    :wanted_2_2));


-- === verifications =========================================================================

-- name: verifications.create --
-- Insert a new verification in `created`; raises IntegrityError if one is active.
-- step 1 of 2
INSERT INTO email_verifications (id, tenant_id, email, state, token_digest, expires_at,
    confirm_attempts, send_count, message_id, template_name, redirect_url, locale, created_at,
    updated_at, sent_at, verified_at)
VALUES (:id, :tenant_id, :email, :state, :token_digest, :expires_at, :confirm_attempts, :send_count,
    :message_id, :template_name, :redirect_url, :locale, :created_at, :updated_at, :sent_at,
    :verified_at);
-- step 2 of 2
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)

-- name: verifications.transition --
-- Move the verifications matching `where` that `action` allows, and log each move.
-- step 1 of 3
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_failed', 'send_pending', 'sent')
    AND email_verifications.id = :id AND email_verifications.token_digest = :token_digest
    AND email_verifications.confirm_attempts < :confirm_attempts;
-- step 2 of 3
UPDATE email_verifications
SET state='verified', updated_at=:updated_at, verified_at=:verified_at
WHERE email_verifications.id IN (:id_1)
    AND email_verifications.state IN ('send_failed', 'send_pending', 'sent')
    AND email_verifications.id = :id_2 AND email_verifications.token_digest = :token_digest
    AND email_verifications.confirm_attempts < :confirm_attempts
RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count,
    message_id, template_name, redirect_url, locale, created_at, updated_at, sent_at, verified_at;
-- step 3 of 3
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)

-- name: verifications.follow_messages --
-- Carry outbox results over to the verifications whose current email they concern.
-- step 1 of 3
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('send_pending')
    AND email_verifications.message_id IN (:message_id_1);
-- step 2 of 3
UPDATE email_verifications
SET state='sent', updated_at=:updated_at, sent_at=:sent_at
WHERE email_verifications.id IN (:id_1) AND email_verifications.state IN ('send_pending')
    AND email_verifications.message_id IN (:message_id_1)
RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count,
    message_id, template_name, redirect_url, locale, created_at, updated_at, sent_at, verified_at;
-- step 3 of 3
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)

-- name: verifications.expire_stale --
-- Move up to `limit` verifications whose time is up but that nobody has read since (a read expires
-- them too) to `expired`, each with its event.
-- step 1 of 3
SELECT email_verifications.id, email_verifications.state AS previous_state
FROM email_verifications
WHERE email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent')
    AND email_verifications.expires_at <= :expires_at
LIMIT :limit OFFSET :offset;
-- step 2 of 3
UPDATE email_verifications
SET state='expired', updated_at=:updated_at
WHERE email_verifications.id IN (:id_1)
    AND email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent')
    AND email_verifications.expires_at <= :expires_at
RETURNING id, tenant_id, email, state, token_digest, expires_at, confirm_attempts, send_count,
    message_id, template_name, redirect_url, locale, created_at, updated_at, sent_at, verified_at;
-- step 3 of 3
INSERT INTO verification_events (verification_id, from_state, to_state, at, actor, message_id,
    detail)
VALUES (:verification_id, :from_state, :to_state, :at, :actor, :message_id, :detail);
-- once per row (executemany)

-- name: verifications.count_wrong_token --
-- A wrong confirmation token: one attempt fewer (not a transition, so no event).
UPDATE email_verifications
SET confirm_attempts=(email_verifications.confirm_attempts + :confirm_attempts),
    updated_at=:updated_at
WHERE email_verifications.id = :id
    AND email_verifications.state IN ('created', 'send_failed', 'send_pending', 'sent');

-- name: verifications.get --
-- One verification of a tenant.
SELECT email_verifications.id, email_verifications.tenant_id, email_verifications.email,
    email_verifications.state, email_verifications.token_digest, email_verifications.expires_at,
    email_verifications.confirm_attempts, email_verifications.send_count,
    email_verifications.message_id, email_verifications.template_name,
    email_verifications.redirect_url, email_verifications.locale, email_verifications.created_at,
    email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at
FROM email_verifications
WHERE email_verifications.id = :id AND email_verifications.tenant_id = :tenant_id;

-- name: verifications.active_for --
-- The verification of an address still under way, if any.
SELECT email_verifications.id, email_verifications.tenant_id, email_verifications.email,
    email_verifications.state, email_verifications.token_digest, email_verifications.expires_at,
    email_verifications.confirm_attempts, email_verifications.send_count,
    email_verifications.message_id, email_verifications.template_name,
    email_verifications.redirect_url, email_verifications.locale, email_verifications.created_at,
    email_verifications.updated_at, email_verifications.sent_at, email_verifications.verified_at
FROM email_verifications
WHERE email_verifications.tenant_id = :tenant_id AND email_verifications.email = :email
    AND email_verifications.state IN ('created', 'send_pending', 'sent');

-- name: verifications.events --
-- A verification's history, oldest first.
SELECT verification_events.id, verification_events.verification_id, verification_events.from_state,
    verification_events.to_state, verification_events.at, verification_events.actor,
    verification_events.message_id, verification_events.detail
FROM verification_events
WHERE verification_events.verification_id = :verification_id ORDER BY verification_events.id;

-- name: verifications.lock_sends --
-- Hold the tenant's verification-send lock until the transaction ends.
-- No statement on SQLite: it runs none here.

-- name: verifications.record_send --
-- The send's row and one more in its tenant's minute (send_rows); runs under lock_sends, as every
-- send does.
-- step 1 of 2
INSERT INTO verification_sends (tenant_id, email, verification_id, at)
VALUES (:tenant_id, :email, :verification_id, :at);
-- step 2 of 2
INSERT INTO verification_send_counts (tenant_id, minute, n)
VALUES (:tenant_id, :minute, :n)
ON CONFLICT (tenant_id, minute)
DO UPDATE SET n = (verification_send_counts.n + excluded.n);

-- name: verifications.sends_since --
-- How many verification emails went out since a time, and the oldest of them.
SELECT count(*) AS n, min(verification_sends.at) AS oldest
FROM verification_sends
WHERE verification_sends.tenant_id = :tenant_id AND verification_sends.at > :at
    AND verification_sends.email = :email;

-- name: verifications.tenant_sends_since --
-- How many verification emails the tenant sent since a time, counted by whole minutes: the minute
-- holding `since` counts whole, so at most 61 rows are read whatever the traffic, and the count
-- errs only on the safe side (a send up to one minute older than the hour may still count: the
-- limit is never exceeded in any hour).
SELECT sum(verification_send_counts.n) AS n, min(verification_send_counts.minute) AS oldest
FROM verification_send_counts
WHERE verification_send_counts.tenant_id = :tenant_id
    AND verification_send_counts.minute >= :minute;


-- === idempotency ===========================================================================

-- name: idempotency.find --
-- The record a tenant's Idempotency-Key holds, if any.
SELECT idempotency_records.id, idempotency_records.tenant_id, idempotency_records.idempotency_key,
    idempotency_records.operation, idempotency_records.fingerprint, idempotency_records.resource_id,
    idempotency_records.response_status, idempotency_records.response_body,
    idempotency_records.created_at, idempotency_records.expires_at
FROM idempotency_records
WHERE idempotency_records.tenant_id = :tenant_id
    AND idempotency_records.idempotency_key = :idempotency_key;

-- name: idempotency.drop_if_expired --
-- An expired record no longer holds its key: remove it so the key can be used again.
DELETE
FROM idempotency_records
WHERE idempotency_records.tenant_id = :tenant_id
    AND idempotency_records.idempotency_key = :idempotency_key
    AND idempotency_records.expires_at <= :expires_at;

-- name: idempotency.take_key --
-- Claim the key; raises IntegrityError when another request holds it.
INSERT INTO idempotency_records (tenant_id, idempotency_key, operation, fingerprint, created_at,
    expires_at)
VALUES (:tenant_id, :idempotency_key, :operation, :fingerprint, :created_at, :expires_at);

-- name: idempotency.record_response --
-- Store the response a key replays.
UPDATE idempotency_records
SET resource_id=:resource_id, response_status=:response_status, response_body=:response_body
WHERE idempotency_records.tenant_id = :tenant_id
    AND idempotency_records.idempotency_key = :idempotency_key;

-- name: idempotency.purge_expired --
-- Delete up to `limit` expired records.
-- step 1 of 2
SELECT idempotency_records.id
FROM idempotency_records
WHERE idempotency_records.expires_at <= :expires_at
LIMIT :limit OFFSET :offset;
-- step 2 of 2
DELETE FROM idempotency_records WHERE idempotency_records.id IN (:id_1);


-- === tenants ===============================================================================

-- name: tenants.create --
-- A new tenant with its API key's digest.
INSERT INTO tenants (id, name, api_key_digest, api_key_prefix, created_at)
VALUES (:id, :name, :api_key_digest, :api_key_prefix, :created_at);

-- name: tenants.by_key_digest --
-- The tenant an API key belongs to.
SELECT tenants.id, tenants.name, tenants.api_key_digest, tenants.api_key_prefix, tenants.created_at
FROM tenants
WHERE tenants.api_key_digest = :api_key_digest;

-- name: tenants.by_name --
-- The tenant of this name.
SELECT tenants.id, tenants.name, tenants.api_key_digest, tenants.api_key_prefix, tenants.created_at
FROM tenants
WHERE tenants.name = :name;

-- name: tenants.named --
-- The tenants whose id or name is `tenant` (two unique indexes: at most two rows).
SELECT tenants.id, tenants.name, tenants.api_key_digest, tenants.api_key_prefix, tenants.created_at
FROM tenants
WHERE tenants.id = :id OR tenants.name = :name;

-- name: tenants.all_tenants --
-- Every tenant, oldest first.
SELECT tenants.id, tenants.name, tenants.api_key_digest, tenants.api_key_prefix, tenants.created_at
FROM tenants ORDER BY tenants.created_at;


-- === console_sessions ======================================================================

-- name: console_sessions.start --
-- A new session; expired ones are cleared on the way (logins are rare, rows few).
-- step 1 of 2
DELETE FROM console_sessions WHERE console_sessions.expires_at <= :expires_at;
-- step 2 of 2
INSERT INTO console_sessions (id_digest, password_fingerprint, created_at, expires_at)
VALUES (:id_digest, :password_fingerprint, :created_at, :expires_at);

-- name: console_sessions.is_live --
-- The session exists, has not expired, and began under the current password.
SELECT console_sessions.id_digest
FROM console_sessions
WHERE console_sessions.id_digest = :id_digest
    AND console_sessions.password_fingerprint = :password_fingerprint
    AND console_sessions.expires_at > :expires_at;

-- name: console_sessions.end --
-- End a session (sign out).
DELETE FROM console_sessions WHERE console_sessions.id_digest = :id_digest;


-- === deployment ============================================================================

-- name: deployment.record_key_check --
-- Store the check value unless one is stored: replicas starting together on a new database all try,
-- the first one's value stays.
INSERT INTO deployment (id, key_check, created_at)
VALUES (:id, :key_check, :created_at)
ON CONFLICT (id) DO NOTHING;

-- name: deployment.replace_key_check --
-- Store the check value in place of whatever is stored (the operator changed the key).
INSERT INTO deployment (id, key_check, created_at)
VALUES (:id, :key_check, :created_at)
ON CONFLICT (id)
DO UPDATE SET key_check = :key_check_2, created_at = :created_at_2;

-- name: deployment.stored_key_check --
-- The stored SECRET_KEY check value.
SELECT deployment.key_check
FROM deployment
WHERE deployment.id = :id;


-- === rate ==================================================================================

-- name: rate.reserve --
-- Take `count` consecutive send slots from `provider`'s schedule at PROVIDER_RATE `rate` (or the
-- lowered rate in force, climbing back over `cooldown`), for the whole fleet; the answer says when
-- each slot comes, on the database's clock.
UPDATE provider_rates
SET next_slot_at=(max(provider_rates.next_slot_at,
    (julianday(:julianday) - :julianday_2) * :now + :next_slot_at) + :next_slot_at_2 / (CASE WHEN
    (provider_rates.lowered_until > (julianday(:julianday) - :julianday_2) * :now) THEN
    min(provider_rates.lowered_rate + (:lowered_rate - provider_rates.lowered_rate) *
    (:next_slot_at_3 - (provider_rates.lowered_until - (julianday(:julianday) - :julianday_2) *
    :now) / (:next_slot_at_4 + 0.0)), :min) ELSE :next_slot_at_5 END + 0.0))
WHERE provider_rates.provider = :provider
RETURNING next_slot_at, lowered_rate, lowered_until,
    (julianday(:julianday) - :julianday_2) * :now AS now;

-- name: rate.throttle --
-- The provider throttled a send: lower `provider`'s rate for every replica for `cooldown` seconds,
-- and hold back every slot for its `retry_after` hint, if any.
UPDATE provider_rates
SET lowered_rate=CASE WHEN (provider_rates.settles_at > (julianday(:julianday) - :julianday_2) *
    :lowered_rate) THEN provider_rates.lowered_rate
    ELSE max(CASE WHEN (provider_rates.lowered_until > (julianday(:julianday) - :julianday_2) *
    :lowered_rate) THEN min(provider_rates.lowered_rate + (:lowered_rate_2 -
    provider_rates.lowered_rate) * (:lowered_rate_3 - (provider_rates.lowered_until -
    (julianday(:julianday) - :julianday_2) * :lowered_rate) / (:lowered_rate_4 + 0.0)),
    :min) ELSE :lowered_rate_5 END * :lowered_rate_6, :max) END, settles_at=CASE
    WHEN (provider_rates.settles_at > (julianday(:julianday) - :julianday_2) * :lowered_rate) THEN
    provider_rates.settles_at ELSE max(provider_rates.next_slot_at,
    (julianday(:julianday) - :julianday_2) * :lowered_rate) + :max_2 END,
    lowered_until=((julianday(:julianday) - :julianday_2) * :lowered_rate + :lowered_until),
    next_slot_at=max(provider_rates.next_slot_at,
    (julianday(:julianday) - :julianday_2) * :lowered_rate + :next_slot_at)
WHERE provider_rates.provider = :provider;

-- name: rate.schedule --
-- `provider`'s row and the database's time: what an operator (or a test) looks at.
SELECT provider_rates.next_slot_at, provider_rates.lowered_rate, provider_rates.lowered_until,
    provider_rates.settles_at, (julianday(:julianday) - :julianday_2) * :now AS now
FROM provider_rates
WHERE provider_rates.provider = :provider;


-- === domain_rates ==========================================================================

-- name: domain_rates.shaped --
-- Every domain still lowered: its row, and the database's time it was read at.
SELECT recipient_domain_rates.domain, recipient_domain_rates.next_slot_at,
    recipient_domain_rates.lowered_rate, recipient_domain_rates.lowered_until,
    recipient_domain_rates.settles_at, (julianday(:julianday) - :julianday_2) * :now AS now
FROM recipient_domain_rates
WHERE recipient_domain_rates.lowered_until > (julianday(:julianday) - :julianday_2) * :now;

-- name: domain_rates.reserve --
-- Take `count` consecutive send slots in `domain`'s schedule at the rate in force (the lowered
-- rate, climbing back to the ceiling), for the whole fleet.
UPDATE recipient_domain_rates
SET next_slot_at=(max(recipient_domain_rates.next_slot_at,
    (julianday(:julianday) - :julianday_2) * :now + :next_slot_at) + :next_slot_at_2 / (CASE WHEN
    (recipient_domain_rates.lowered_until > (julianday(:julianday) - :julianday_2) * :now) THEN
    min(recipient_domain_rates.lowered_rate + (:lowered_rate - recipient_domain_rates.lowered_rate)
    * (:next_slot_at_3 - (recipient_domain_rates.lowered_until - (julianday(:julianday) -
    :julianday_2) * :now) / (:next_slot_at_4 + 0.0)), :min) ELSE :next_slot_at_5 END + 0.0))
WHERE recipient_domain_rates.domain = :domain
RETURNING next_slot_at, lowered_rate, lowered_until,
    (julianday(:julianday) - :julianday_2) * :now AS now;

-- name: domain_rates.defer --
-- `domain` deferred a send: lower its rate for every replica (halved, or only its recovery
-- restarted while the deferral is of sends made before the last lowering took effect, `settle`
-- seconds after its slots taken); its row after, and the database's time.
-- step 1 of 5
UPDATE recipient_domain_rates
SET lowered_rate=CASE WHEN (recipient_domain_rates.settles_at > (julianday(:julianday) -
    :julianday_2) * :lowered_rate) THEN recipient_domain_rates.lowered_rate
    ELSE max(CASE WHEN (recipient_domain_rates.lowered_until > (julianday(:julianday) -
    :julianday_2) * :lowered_rate) THEN min(recipient_domain_rates.lowered_rate + (:lowered_rate_2 -
    recipient_domain_rates.lowered_rate) * (:lowered_rate_3 - (recipient_domain_rates.lowered_until
    - (julianday(:julianday) - :julianday_2) * :lowered_rate) / (:lowered_rate_4 + 0.0)),
    :min) ELSE :lowered_rate_5 END * :lowered_rate_6, :max) END, settles_at=CASE
    WHEN (recipient_domain_rates.settles_at > (julianday(:julianday) - :julianday_2) *
    :lowered_rate) THEN recipient_domain_rates.settles_at
    ELSE max(recipient_domain_rates.next_slot_at,
    (julianday(:julianday) - :julianday_2) * :lowered_rate) + :max_2 END,
    lowered_until=((julianday(:julianday) - :julianday_2) * :lowered_rate + :lowered_until),
    next_slot_at=max(recipient_domain_rates.next_slot_at,
    (julianday(:julianday) - :julianday_2) * :lowered_rate + :next_slot_at)
WHERE recipient_domain_rates.domain = :domain;
-- step 2 of 5
SELECT (julianday(:julianday) - :julianday_2) * :now AS now;
-- step 3 of 5
INSERT INTO recipient_domain_rates (domain, next_slot_at, lowered_rate, lowered_until, settles_at)
VALUES (:domain, :next_slot_at, :lowered_rate, :lowered_until, :settles_at)
ON CONFLICT (domain) DO NOTHING;
-- step 4 of 5
UPDATE recipient_domain_rates
SET lowered_rate=CASE WHEN (recipient_domain_rates.settles_at > (julianday(:julianday) -
    :julianday_2) * :lowered_rate) THEN recipient_domain_rates.lowered_rate
    ELSE max(CASE WHEN (recipient_domain_rates.lowered_until > (julianday(:julianday) -
    :julianday_2) * :lowered_rate) THEN min(recipient_domain_rates.lowered_rate + (:lowered_rate_2 -
    recipient_domain_rates.lowered_rate) * (:lowered_rate_3 - (recipient_domain_rates.lowered_until
    - (julianday(:julianday) - :julianday_2) * :lowered_rate) / (:lowered_rate_4 + 0.0)),
    :min) ELSE :lowered_rate_5 END * :lowered_rate_6, :max) END, settles_at=CASE
    WHEN (recipient_domain_rates.settles_at > (julianday(:julianday) - :julianday_2) *
    :lowered_rate) THEN recipient_domain_rates.settles_at
    ELSE max(recipient_domain_rates.next_slot_at,
    (julianday(:julianday) - :julianday_2) * :lowered_rate) + :max_2 END,
    lowered_until=((julianday(:julianday) - :julianday_2) * :lowered_rate + :lowered_until),
    next_slot_at=max(recipient_domain_rates.next_slot_at,
    (julianday(:julianday) - :julianday_2) * :lowered_rate + :next_slot_at)
WHERE recipient_domain_rates.domain = :domain;
-- step 5 of 5
SELECT recipient_domain_rates.next_slot_at, recipient_domain_rates.lowered_rate,
    recipient_domain_rates.lowered_until, recipient_domain_rates.settles_at,
    (julianday(:julianday) - :julianday_2) * :now AS now
FROM recipient_domain_rates
WHERE recipient_domain_rates.domain = :domain;

-- name: domain_rates.schedule --
-- `domain`'s row and the database's time: what an operator (or a test) looks at.
SELECT recipient_domain_rates.next_slot_at, recipient_domain_rates.lowered_rate,
    recipient_domain_rates.lowered_until, recipient_domain_rates.settles_at,
    (julianday(:julianday) - :julianday_2) * :now AS now
FROM recipient_domain_rates
WHERE recipient_domain_rates.domain = :domain;

-- name: domain_rates.forget --
-- Delete up to `limit` rows of domains no longer slowed for FORGET_AFTER_SECONDS (a domain that
-- defers again gets a new row); how many were deleted.
-- step 1 of 2
SELECT recipient_domain_rates.domain
FROM recipient_domain_rates
WHERE recipient_domain_rates.lowered_until < (julianday(:julianday) - :julianday_2) * :value -
    :value_2
LIMIT :limit OFFSET :offset;
-- step 2 of 2
DELETE
FROM recipient_domain_rates
WHERE recipient_domain_rates.domain IN (:domain_1)
    AND recipient_domain_rates.lowered_until < (julianday(:julianday) - :julianday_2) * :value -
    :value_2;


-- === fleet_state ===========================================================================

-- name: fleet_state.read --
-- Every provider's breaker and every pause: two small tables, read in one round trip where the
-- runner can (`last`: nothing follows in the plan).
-- step 1 of 4
BEGIN;
-- step 2 of 4
SELECT provider_health.name, provider_health.failures_in_row, provider_health.open_until,
    provider_health.last_error, provider_health.updated_at
FROM provider_health;
-- step 3 of 4
SELECT pauses.scope, pauses.target, pauses.paused_at, pauses.paused_by, pauses.reason
FROM pauses ORDER BY pauses.paused_at;
-- step 4 of 4
COMMIT;

-- name: fleet_state.record --
-- Providers that answered close their breaker (a write only where one had failed); each of `failed`
-- (name: failures, last error) adds to its failures in a row and opens once the breaker says so.
-- step 1 of 4
UPDATE provider_health
SET failures_in_row=:failures_in_row, open_until=:open_until, last_error=:last_error,
    updated_at=:updated_at
WHERE provider_health.name IN (:name_1) AND provider_health.failures_in_row != :failures_in_row_2;
-- step 2 of 4
INSERT INTO provider_health (name, failures_in_row, last_error, updated_at)
VALUES (:name, :failures_in_row, :last_error, :updated_at)
ON CONFLICT (name) DO NOTHING;
-- step 3 of 4
SELECT provider_health.failures_in_row
FROM provider_health
WHERE provider_health.name = :name;
-- step 4 of 4
UPDATE provider_health
SET failures_in_row=:failures_in_row, last_error=:last_error, updated_at=:updated_at
WHERE provider_health.name = :name;

-- name: fleet_state.pause --
-- Pause `target` (False: it was paused already, and stays as it was).
SELECT pauses.scope
FROM pauses
WHERE pauses.scope = :scope AND pauses.target = :target;

-- name: fleet_state.resume --
-- Resume `target` (False: it was not paused).
DELETE FROM pauses WHERE pauses.scope = :scope AND pauses.target = :target;

-- name: fleet_state.announce --
-- Tell the fleet's workers its state changed (PostgreSQL; elsewhere they poll).
-- No statement on SQLite: it runs none here.


-- === sender_domains ========================================================================

-- name: sender_domains.add --
-- Add a domain with its first key, signing; False (nothing written) if the tenant has the domain
-- already.
-- step 1 of 3
SELECT sender_domains.domain
FROM sender_domains
WHERE sender_domains.tenant_id = :tenant_id AND sender_domains.domain = :domain;
-- step 2 of 3
INSERT INTO sender_domains (tenant_id, domain, created_at, created_by, ready)
VALUES (:tenant_id, :domain, :created_at, :created_by, :ready);
-- step 3 of 3
INSERT INTO dkim_keys (tenant_id, domain, selector, algorithm, state, public_key,
    sealed_private_key, created_at)
VALUES (:tenant_id, :domain, :selector, :algorithm, :state, :public_key, :sealed_private_key,
    :created_at);

-- name: sender_domains.add_key --
-- A rotation's first step: a `next` key beside the signing one.
INSERT INTO dkim_keys (tenant_id, domain, selector, algorithm, state, public_key,
    sealed_private_key, created_at)
VALUES (:tenant_id, :domain, :selector, :algorithm, :state, :public_key, :sealed_private_key,
    :created_at);

-- name: sender_domains.promote --
-- A rotation's last step: `selector` signs, the one that signed is retired.
-- step 1 of 2
UPDATE dkim_keys
SET state=:state
WHERE dkim_keys.tenant_id = :tenant_id AND dkim_keys.domain = :domain AND dkim_keys.state = :state_2
    AND dkim_keys.selector != :selector;
-- step 2 of 2
UPDATE dkim_keys
SET state=:state
WHERE dkim_keys.tenant_id = :tenant_id AND dkim_keys.domain = :domain
    AND dkim_keys.selector = :selector;

-- name: sender_domains.remove --
-- Remove a domain and its keys; False if the tenant has no such domain.
-- step 1 of 2
DELETE FROM dkim_keys WHERE dkim_keys.tenant_id = :tenant_id AND dkim_keys.domain = :domain;
-- step 2 of 2
DELETE
FROM sender_domains
WHERE sender_domains.tenant_id = :tenant_id AND sender_domains.domain = :domain;

-- name: sender_domains.remove_key --
-- Remove one key that does not sign; False if there is none by that selector.
DELETE
FROM dkim_keys
WHERE dkim_keys.tenant_id = :tenant_id AND dkim_keys.domain = :domain
    AND dkim_keys.selector = :selector AND dkim_keys.state != :state;

-- name: sender_domains.one --
-- A tenant's domain with its keys (sealed), or None.
-- step 1 of 2
SELECT sender_domains.tenant_id, sender_domains.domain, sender_domains.created_at,
    sender_domains.created_by, sender_domains.ready, sender_domains.checked_at,
    sender_domains.ready_since, sender_domains.report
FROM sender_domains
WHERE sender_domains.tenant_id = :tenant_id AND sender_domains.domain = :domain
ORDER BY sender_domains.tenant_id, sender_domains.domain;
-- step 2 of 2
SELECT dkim_keys.tenant_id, dkim_keys.domain, dkim_keys.selector, dkim_keys.algorithm,
    dkim_keys.state, dkim_keys.public_key, dkim_keys.sealed_private_key, dkim_keys.created_at
FROM dkim_keys JOIN sender_domains ON dkim_keys.tenant_id = sender_domains.tenant_id
    AND dkim_keys.domain = sender_domains.domain
WHERE sender_domains.tenant_id = :tenant_id AND sender_domains.domain = :domain
ORDER BY dkim_keys.selector;

-- name: sender_domains.listing --
-- Every domain (of one tenant, or all), by tenant and domain, with their keys.
-- step 1 of 2
SELECT sender_domains.tenant_id, sender_domains.domain, sender_domains.created_at,
    sender_domains.created_by, sender_domains.ready, sender_domains.checked_at,
    sender_domains.ready_since, sender_domains.report
FROM sender_domains
WHERE sender_domains.tenant_id = :tenant_id
ORDER BY sender_domains.tenant_id, sender_domains.domain;
-- step 2 of 2
SELECT dkim_keys.tenant_id, dkim_keys.domain, dkim_keys.selector, dkim_keys.algorithm,
    dkim_keys.state, dkim_keys.public_key, dkim_keys.sealed_private_key, dkim_keys.created_at
FROM dkim_keys JOIN sender_domains ON dkim_keys.tenant_id = sender_domains.tenant_id
    AND dkim_keys.domain = sender_domains.domain
WHERE sender_domains.tenant_id = :tenant_id ORDER BY dkim_keys.selector;

-- name: sender_domains.record_check --
-- Keep what a check found; `ready_since` moves only when readiness changed.
-- step 1 of 2
SELECT sender_domains.ready
FROM sender_domains
WHERE sender_domains.tenant_id = :tenant_id AND sender_domains.domain = :domain;
-- step 2 of 2
UPDATE sender_domains
SET ready=:ready, checked_at=:checked_at, report=:report
WHERE sender_domains.tenant_id = :tenant_id AND sender_domains.domain = :domain;

-- name: sender_domains.due --
-- Domains last checked before `before` (or never), oldest first.
SELECT sender_domains.tenant_id, sender_domains.domain
FROM sender_domains
WHERE sender_domains.checked_at IS NULL OR sender_domains.checked_at < :checked_at
ORDER BY sender_domains.checked_at IS NOT NULL, sender_domains.checked_at
LIMIT :limit OFFSET :offset;

-- name: sender_domains.unready --
-- The messages (by position) whose From (its own, else `default_from`) is on a domain that is not
-- ready, neither their tenant's nor the deployment's (the default tenant's), each with its error.
SELECT sender_domains.tenant_id, sender_domains.domain, sender_domains.ready
FROM sender_domains
WHERE sender_domains.tenant_id IN (:tenant_id_1, :tenant_id_2)
    AND sender_domains.domain IN (:domain_1);

-- name: sender_domains.not_ready_count --
-- Domains whose last check found them not ready (the metric's).
SELECT count(*) AS count_1
FROM sender_domains
WHERE sender_domains.ready IS 0;

-- name: sender_domains.signing_keys --
-- Every domain's signing key (sealed), by (tenant, domain): what a worker signs with.
SELECT dkim_keys.tenant_id, dkim_keys.domain, dkim_keys.selector, dkim_keys.algorithm,
    dkim_keys.state, dkim_keys.public_key, dkim_keys.sealed_private_key, dkim_keys.created_at
FROM dkim_keys
WHERE dkim_keys.state = :state;


-- === hooks =================================================================================

-- name: hooks.fan_out --
-- One delivery per (event, subscribed enabled endpoint of the subject's tenant); returns how many.
-- step 1 of 2
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.events
FROM hook_endpoints
WHERE hook_endpoints.tenant_id IN (:tenant_id_1) AND hook_endpoints.enabled = 1;
-- step 2 of 2
INSERT INTO hook_deliveries (id, endpoint_id, tenant_id, event, message_id, webhook_id, payload,
    status, attempts, max_attempts, next_attempt_at, created_at, updated_at)
VALUES (:id, :endpoint_id, :tenant_id, :event, :message_id, :webhook_id, :payload, :status,
    :attempts, :max_attempts, :next_attempt_at, :created_at, :updated_at);
-- once per row (executemany)

-- name: hooks.create_endpoint --
-- A new hook endpoint, its secret sealed.
INSERT INTO hook_endpoints (id, tenant_id, url, events, enabled, description, secret, created_at,
    updated_at)
VALUES (:id, :tenant_id, :url, :events, :enabled, :description, :secret, :created_at, :updated_at);

-- name: hooks.endpoint --
-- One hook endpoint (of a tenant).
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.url, hook_endpoints.events,
    hook_endpoints.enabled, hook_endpoints.description, hook_endpoints.secret,
    hook_endpoints.created_at, hook_endpoints.updated_at, hook_endpoints.failures_in_row,
    hook_endpoints.paused_until
FROM hook_endpoints
WHERE hook_endpoints.id = :id AND hook_endpoints.tenant_id = :tenant_id;

-- name: hooks.endpoints --
-- Oldest first; one tenant's, or everyone's.
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.url, hook_endpoints.events,
    hook_endpoints.enabled, hook_endpoints.description, hook_endpoints.secret,
    hook_endpoints.created_at, hook_endpoints.updated_at, hook_endpoints.failures_in_row,
    hook_endpoints.paused_until
FROM hook_endpoints
WHERE hook_endpoints.tenant_id = :tenant_id ORDER BY hook_endpoints.created_at, hook_endpoints.id;

-- name: hooks.update_endpoint --
-- Change what is given; None if there is no such endpoint (in that tenant).
-- step 1 of 2
UPDATE hook_endpoints
SET enabled=:enabled, updated_at=:updated_at
WHERE hook_endpoints.id = :id AND hook_endpoints.tenant_id = :tenant_id;
-- step 2 of 2
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.url, hook_endpoints.events,
    hook_endpoints.enabled, hook_endpoints.description, hook_endpoints.secret,
    hook_endpoints.created_at, hook_endpoints.updated_at, hook_endpoints.failures_in_row,
    hook_endpoints.paused_until
FROM hook_endpoints
WHERE hook_endpoints.id = :id;

-- name: hooks.delete_endpoint --
-- Remove an endpoint with its deliveries (their history goes by ON DELETE CASCADE).
-- step 1 of 3
SELECT hook_endpoints.id, hook_endpoints.tenant_id, hook_endpoints.url, hook_endpoints.events,
    hook_endpoints.enabled, hook_endpoints.description, hook_endpoints.secret,
    hook_endpoints.created_at, hook_endpoints.updated_at, hook_endpoints.failures_in_row,
    hook_endpoints.paused_until
FROM hook_endpoints
WHERE hook_endpoints.id = :id AND hook_endpoints.tenant_id = :tenant_id;
-- step 2 of 3
DELETE FROM hook_deliveries WHERE hook_deliveries.endpoint_id = :endpoint_id;
-- step 3 of 3
DELETE FROM hook_endpoints WHERE hook_endpoints.id = :id;

-- name: hooks.claim --
-- Take up to `limit` due deliveries of enabled, unpaused endpoints under one claim token, oldest
-- due first, each endpoint's no more than its room (`Fairness`); other claimers skip what this one
-- locked (see transition.py).
-- step 1 of 5
WITH room AS
(SELECT hook_endpoints.id AS endpoint_id, CASE
    WHEN (hook_endpoints.failures_in_row >= :failures_in_row) THEN :room
    ELSE :room_2 END - coalesce(in_flight.n, :coalesce) AS room
FROM hook_endpoints LEFT OUTER JOIN (SELECT hook_deliveries.endpoint_id AS endpoint_id,
    count(*) AS n
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing')
GROUP BY hook_deliveries.endpoint_id) AS in_flight ON in_flight.endpoint_id = hook_endpoints.id
WHERE hook_endpoints.enabled = 1 AND (hook_endpoints.paused_until IS NULL OR
    hook_endpoints.paused_until <= :now) AND CASE
    WHEN (hook_endpoints.failures_in_row >= :failures_in_row) THEN :room
    ELSE :room_2 END - coalesce(in_flight.n, :coalesce) > :value)
SELECT hook_deliveries.id, hook_deliveries.endpoint_id, room.room
FROM hook_deliveries JOIN room ON room.endpoint_id = hook_deliveries.endpoint_id
WHERE hook_deliveries.status IN ('pending', 'retrying') AND hook_deliveries.next_attempt_at <= :now
ORDER BY hook_deliveries.next_attempt_at, hook_deliveries.id
LIMIT :window OFFSET :offset;
-- step 2 of 5
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('pending', 'retrying') AND hook_deliveries.id IN (:id_1)
    AND hook_deliveries.next_attempt_at <= :next_attempt_at
ORDER BY hook_deliveries.next_attempt_at, hook_deliveries.id
LIMIT :limit OFFSET :offset;
-- step 3 of 5
UPDATE hook_deliveries
SET status='processing', updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by,
    lease_expires_at=:lease_expires_at
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('pending', 'retrying')
    AND hook_deliveries.id IN (:id_2_1) AND hook_deliveries.next_attempt_at <= :next_attempt_at
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 4 of 5
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)
-- step 5 of 5
SELECT hook_endpoints.id, hook_endpoints.url, hook_endpoints.secret
FROM hook_endpoints
WHERE hook_endpoints.id IN (:id_1);

-- name: hooks.finalize --
-- Record each attempt where the claim is still `token`'s; return the deliveries changed (one swept
-- and claimed again by another worker meanwhile is left alone).
-- step 1 of 3
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.id IN (:id_1)
    AND hook_deliveries.claim_token = :claim_token;
-- step 2 of 3
UPDATE hook_deliveries
SET status='delivered', attempts=(hook_deliveries.attempts + :attempts), updated_at=:updated_at,
    delivered_at=:delivered_at, claim_token=:claim_token, claimed_by=:claimed_by,
    lease_expires_at=:lease_expires_at, last_status_code=:last_status_code, last_error=:last_error
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('processing')
    AND hook_deliveries.id IN (:id_2_1) AND hook_deliveries.claim_token = :claim_token_2
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 3 of 3
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)

-- name: hooks.settle --
-- `finalize`, and each endpoint's breaker moved by what its attempts did, in the same transaction.
-- step 1 of 6
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.id IN (:id_1)
    AND hook_deliveries.claim_token = :claim_token;
-- step 2 of 6
UPDATE hook_deliveries
SET status='retrying', attempts=(hook_deliveries.attempts + :attempts),
    next_attempt_at=:next_attempt_at, updated_at=:updated_at, claim_token=:claim_token,
    claimed_by=:claimed_by, lease_expires_at=:lease_expires_at, last_status_code=:last_status_code,
    last_error=:last_error
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('processing')
    AND hook_deliveries.id IN (:id_2_1) AND hook_deliveries.claim_token = :claim_token_2
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 3 of 6
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)
-- step 4 of 6
UPDATE hook_endpoints
SET failures_in_row=(hook_endpoints.failures_in_row + :failures_in_row)
WHERE hook_endpoints.id = :id;
-- step 5 of 6
SELECT hook_endpoints.failures_in_row
FROM hook_endpoints
WHERE hook_endpoints.id = :id;
-- step 6 of 6
UPDATE hook_endpoints SET paused_until=:paused_until WHERE hook_endpoints.id = :id;

-- name: hooks.finalize_claims --
-- `finalize` for the attempts of several claims (by claim token) at once: one UPDATE for each kind
-- of outcome, however many deliveries and claims, each row guarded by its own claim's token and
-- given its own status code, error and due time (store.per_row.PerRow).
-- step 1 of 6
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.id IN (:id_1, :id_2)
    AND hook_deliveries.claim_token = CASE hook_deliveries.id WHEN :id_2 THEN :value
    WHEN :id_3 THEN :value_2 ELSE :value_3 END;
-- step 2 of 6
UPDATE hook_deliveries
SET status='delivered', attempts=(hook_deliveries.attempts + :attempts), updated_at=:updated_at,
    delivered_at=:delivered_at, claim_token=:claim_token, claimed_by=:claimed_by,
    lease_expires_at=:lease_expires_at, last_status_code=CASE hook_deliveries.id
    WHEN :id THEN :last_status_code WHEN :id_2 THEN :last_status_code_2
    ELSE :last_status_code_3 END, last_error=:last_error
WHERE hook_deliveries.id IN (:id_3_1) AND hook_deliveries.status IN ('processing')
    AND hook_deliveries.id IN (:id_4_1, :id_4_2)
    AND hook_deliveries.claim_token = CASE hook_deliveries.id WHEN :id_5 THEN :value
    WHEN :id_6 THEN :value_2 ELSE :value_3 END
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 3 of 6
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)
-- step 4 of 6
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.id IN (:id_1)
    AND hook_deliveries.claim_token = :claim_token;
-- step 5 of 6
UPDATE hook_deliveries
SET status='retrying', attempts=(hook_deliveries.attempts + :attempts),
    next_attempt_at=:next_attempt_at, updated_at=:updated_at, claim_token=:claim_token,
    claimed_by=:claimed_by, lease_expires_at=:lease_expires_at, last_status_code=:last_status_code,
    last_error=:last_error
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('processing')
    AND hook_deliveries.id IN (:id_2_1) AND hook_deliveries.claim_token = :claim_token_2
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 6 of 6
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)

-- name: hooks.settle_claims --
-- `settle` for the attempts of several claims (by claim token) at once.
-- step 1 of 7
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.id IN (:id_1)
    AND hook_deliveries.claim_token = :claim_token;
-- step 2 of 7
UPDATE hook_deliveries
SET status='delivered', attempts=(hook_deliveries.attempts + :attempts), updated_at=:updated_at,
    delivered_at=:delivered_at, claim_token=:claim_token, claimed_by=:claimed_by,
    lease_expires_at=:lease_expires_at, last_status_code=:last_status_code, last_error=:last_error
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('processing')
    AND hook_deliveries.id IN (:id_2_1) AND hook_deliveries.claim_token = :claim_token_2
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 3 of 7
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)
-- step 4 of 7
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.id IN (:id_1)
    AND hook_deliveries.claim_token = :claim_token;
-- step 5 of 7
UPDATE hook_deliveries
SET status='retrying', attempts=(hook_deliveries.attempts + :attempts),
    next_attempt_at=:next_attempt_at, updated_at=:updated_at, claim_token=:claim_token,
    claimed_by=:claimed_by, lease_expires_at=:lease_expires_at, last_status_code=:last_status_code,
    last_error=:last_error
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('processing')
    AND hook_deliveries.id IN (:id_2_1) AND hook_deliveries.claim_token = :claim_token_2
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 6 of 7
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)
-- step 7 of 7
UPDATE hook_endpoints
SET failures_in_row=:failures_in_row, paused_until=:paused_until
WHERE hook_endpoints.id IN (SELECT hook_deliveries.endpoint_id
FROM hook_deliveries
WHERE hook_deliveries.id IN (:id_1)
    AND hook_deliveries.status IN ('delivered')) AND (hook_endpoints.failures_in_row !=
    :failures_in_row_2 OR hook_endpoints.paused_until IS NOT NULL);

-- name: hooks.turn --
-- The deliverer's transaction: record the attempts of these claims that finished (`settle_claims`),
-- then claim up to `limit` more (`claim`); the claim sees the room the recording made (a finished
-- delivery counts in flight until it is recorded).
-- step 1 of 9
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing') AND hook_deliveries.id IN (:id_1)
    AND hook_deliveries.claim_token = :claim_token;
-- step 2 of 9
UPDATE hook_deliveries
SET status='delivered', attempts=(hook_deliveries.attempts + :attempts), updated_at=:updated_at,
    delivered_at=:delivered_at, claim_token=:claim_token, claimed_by=:claimed_by,
    lease_expires_at=:lease_expires_at, last_status_code=:last_status_code, last_error=:last_error
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('processing')
    AND hook_deliveries.id IN (:id_2_1) AND hook_deliveries.claim_token = :claim_token_2
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 3 of 9
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)
-- step 4 of 9
UPDATE hook_endpoints
SET failures_in_row=:failures_in_row, paused_until=:paused_until
WHERE hook_endpoints.id IN (SELECT hook_deliveries.endpoint_id
FROM hook_deliveries
WHERE hook_deliveries.id IN (:id_1)
    AND hook_deliveries.status IN ('delivered')) AND (hook_endpoints.failures_in_row !=
    :failures_in_row_2 OR hook_endpoints.paused_until IS NOT NULL);
-- step 5 of 9
WITH room AS
(SELECT hook_endpoints.id AS endpoint_id, CASE
    WHEN (hook_endpoints.failures_in_row >= :failures_in_row) THEN :room
    ELSE :room_2 END - coalesce(in_flight.n, :coalesce) AS room
FROM hook_endpoints LEFT OUTER JOIN (SELECT hook_deliveries.endpoint_id AS endpoint_id,
    count(*) AS n
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing')
GROUP BY hook_deliveries.endpoint_id) AS in_flight ON in_flight.endpoint_id = hook_endpoints.id
WHERE hook_endpoints.enabled = 1 AND (hook_endpoints.paused_until IS NULL OR
    hook_endpoints.paused_until <= :now) AND CASE
    WHEN (hook_endpoints.failures_in_row >= :failures_in_row) THEN :room
    ELSE :room_2 END - coalesce(in_flight.n, :coalesce) > :value)
SELECT hook_deliveries.id, hook_deliveries.endpoint_id, room.room
FROM hook_deliveries JOIN room ON room.endpoint_id = hook_deliveries.endpoint_id
WHERE hook_deliveries.status IN ('pending', 'retrying') AND hook_deliveries.next_attempt_at <= :now
ORDER BY hook_deliveries.next_attempt_at, hook_deliveries.id
LIMIT :window OFFSET :offset;
-- step 6 of 9
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('pending', 'retrying') AND hook_deliveries.id IN (:id_1)
    AND hook_deliveries.next_attempt_at <= :next_attempt_at
ORDER BY hook_deliveries.next_attempt_at, hook_deliveries.id
LIMIT :limit OFFSET :offset;
-- step 7 of 9
UPDATE hook_deliveries
SET status='processing', updated_at=:updated_at, claim_token=:claim_token, claimed_by=:claimed_by,
    lease_expires_at=:lease_expires_at
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('pending', 'retrying')
    AND hook_deliveries.id IN (:id_2_1) AND hook_deliveries.next_attempt_at <= :next_attempt_at
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 8 of 9
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)
-- step 9 of 9
SELECT hook_endpoints.id, hook_endpoints.url, hook_endpoints.secret
FROM hook_endpoints
WHERE hook_endpoints.id IN (:id_1);

-- name: hooks.sweep --
-- Deliveries whose lease ran out (their worker died or hung mid-POST) go back to `retrying`, due
-- now: the POST may have arrived, so the receiver may see it twice, with the same webhook-id.
-- step 1 of 3
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('processing')
    AND hook_deliveries.lease_expires_at < :lease_expires_at
ORDER BY hook_deliveries.lease_expires_at
LIMIT :limit OFFSET :offset;
-- step 2 of 3
UPDATE hook_deliveries
SET status=CASE WHEN (hook_deliveries.attempts + :attempts < hook_deliveries.max_attempts) THEN
    'retrying' ELSE 'dead' END, attempts=(hook_deliveries.attempts + :attempts_2),
    next_attempt_at=:next_attempt_at, updated_at=:updated_at, claim_token=:claim_token,
    claimed_by=:claimed_by, lease_expires_at=:lease_expires_at, last_status_code=:last_status_code,
    last_error=:last_error
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('processing')
    AND hook_deliveries.lease_expires_at < :lease_expires_at_2
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 3 of 3
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)

-- name: hooks.delivery --
-- A delivery and its history, oldest move first.
-- step 1 of 2
SELECT hook_deliveries.id, hook_deliveries.endpoint_id, hook_deliveries.tenant_id,
    hook_deliveries.event, hook_deliveries.message_id, hook_deliveries.webhook_id,
    hook_deliveries.payload, hook_deliveries.status, hook_deliveries.attempts,
    hook_deliveries.max_attempts, hook_deliveries.next_attempt_at, hook_deliveries.created_at,
    hook_deliveries.updated_at, hook_deliveries.delivered_at, hook_deliveries.claim_token,
    hook_deliveries.claimed_by, hook_deliveries.lease_expires_at, hook_deliveries.last_status_code,
    hook_deliveries.last_error, hook_endpoints.url
FROM hook_deliveries LEFT OUTER JOIN hook_endpoints ON hook_endpoints.id =
    hook_deliveries.endpoint_id
WHERE hook_deliveries.id = :id AND hook_deliveries.tenant_id = :tenant_id;
-- step 2 of 2
SELECT hook_delivery_events.id, hook_delivery_events.delivery_id, hook_delivery_events.from_status,
    hook_delivery_events.to_status, hook_delivery_events.at, hook_delivery_events.actor,
    hook_delivery_events.attempt, hook_delivery_events.status_code, hook_delivery_events.detail
FROM hook_delivery_events
WHERE hook_delivery_events.delivery_id = :delivery_id ORDER BY hook_delivery_events.id;

-- name: hooks.page --
-- Deliveries newest first, `limit` of them after the cursor; and whether more follow.
SELECT hook_deliveries.id, hook_deliveries.endpoint_id, hook_deliveries.tenant_id,
    hook_deliveries.event, hook_deliveries.message_id, hook_deliveries.webhook_id,
    hook_deliveries.payload, hook_deliveries.status, hook_deliveries.attempts,
    hook_deliveries.max_attempts, hook_deliveries.next_attempt_at, hook_deliveries.created_at,
    hook_deliveries.updated_at, hook_deliveries.delivered_at, hook_deliveries.claim_token,
    hook_deliveries.claimed_by, hook_deliveries.lease_expires_at, hook_deliveries.last_status_code,
    hook_deliveries.last_error, hook_endpoints.url
FROM hook_deliveries LEFT OUTER JOIN hook_endpoints ON hook_endpoints.id =
    hook_deliveries.endpoint_id
WHERE hook_deliveries.tenant_id = :tenant_id
    AND (hook_deliveries.created_at < :created_at OR hook_deliveries.created_at = :created_at_2 AND
    hook_deliveries.id < :id)
ORDER BY hook_deliveries.created_at DESC, hook_deliveries.id DESC
LIMIT :limit OFFSET :offset;

-- name: hooks.replay --
-- A delivered or dead delivery goes out again: same webhook-id and body, due now, a fresh budget
-- (attempt numbers keep counting, so max = done + extra).
-- step 1 of 3
SELECT hook_deliveries.id, hook_deliveries.status AS previous_state
FROM hook_deliveries
WHERE hook_deliveries.status IN ('dead', 'delivered') AND hook_deliveries.id = :id
    AND hook_deliveries.tenant_id = :tenant_id;
-- step 2 of 3
UPDATE hook_deliveries
SET status='pending', max_attempts=(hook_deliveries.attempts + :attempts),
    next_attempt_at=:next_attempt_at, updated_at=:updated_at, delivered_at=:delivered_at,
    claim_token=:claim_token, claimed_by=:claimed_by, lease_expires_at=:lease_expires_at
WHERE hook_deliveries.id IN (:id_1) AND hook_deliveries.status IN ('dead', 'delivered')
    AND hook_deliveries.id = :id_2 AND hook_deliveries.tenant_id = :tenant_id
RETURNING id, endpoint_id, tenant_id, event, message_id, webhook_id, payload, status, attempts,
    max_attempts, next_attempt_at, created_at, updated_at, delivered_at, claim_token, claimed_by,
    lease_expires_at, last_status_code, last_error;
-- step 3 of 3
INSERT INTO hook_delivery_events (delivery_id, from_status, to_status, at, actor, attempt,
    status_code, detail)
VALUES (:delivery_id, :from_status, :to_status, :at, :actor, :attempt, :status_code, :detail);
-- once per row (executemany)
