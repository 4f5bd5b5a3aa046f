-- dispatch.extend_lease (sqlite)
-- Push the lease of messages still in flight; not a transition, so no event.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
UPDATE outbox_messages SET updated_at=:updated_at, lease_expires_at=:lease_expires_at WHERE outbox_messages.id IN (:id_1_1, :id_1_2) AND outbox_messages.claim_token = :claim_token_1 AND outbox_messages.status = :status_1;
