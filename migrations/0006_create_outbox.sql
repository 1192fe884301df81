-- Messages to the outside (pipeline notifications, commit statuses) are written here in the
-- same transaction as the event they report, and delivered from here at least once, with
-- retries, by whichever server process is running: a crash or restart loses none.
CREATE TABLE outbox (
    id               bigserial PRIMARY KEY,
    environment_id   uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    -- notify: signed pipeline event to the source's notify URL
    -- status: commit status on the git host
    kind             text NOT NULL CHECK (kind IN ('notify', 'status')),
    payload          jsonb NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    -- also a lease: a delivery in progress pushes it forward
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    -- given up: refused (4xx), no destination any more, or too many failed attempts
    abandoned_at     timestamptz,
    last_error       text
);
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE delivered_at IS NULL AND abandoned_at IS NULL;
CREATE INDEX outbox_done ON outbox (created_at) WHERE delivered_at IS NOT NULL OR abandoned_at IS NOT NULL;

-- pipeline events are looked up by (commit, event) when they are derived from state
CREATE INDEX commit_events_event ON commit_events (environment_id, event, commit);
CREATE INDEX compiles_finished ON compiles (environment_id, finished_at);
CREATE INDEX resource_actions_env_started ON resource_actions (environment_id, started_at);

-- code blobs are pruned when no version refers to them; a blob younger than an hour may
-- belong to a version being stored right now
ALTER TABLE code_blobs ADD COLUMN created_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX webhook_deliveries_received ON webhook_deliveries (environment_id, received_at);
CREATE INDEX audit_log_at ON audit_log (at);
