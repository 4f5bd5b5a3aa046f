-- dispatch.extend_lease (postgresql)
-- Push the lease of messages still in flight; not a transition, so no event.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE outbox_messages SET updated_at=:updated_at::TIMESTAMP WITH TIME ZONE, lease_expires_at=:lease_expires_at::TIMESTAMP WITH TIME ZONE WHERE outbox_messages.id IN (:id_1_1::UUID, :id_1_2::UUID) AND outbox_messages.claim_token = :claim_token_1::UUID AND outbox_messages.status = :status_1::VARCHAR;
