-- Per-resource deploy state (survives versions), agents, and the scheduler's progress.

CREATE TABLE resource_state (
    environment_id        uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    resource_id           text NOT NULL,
    agent                 text NOT NULL,
    -- the intent the scheduler last merged (version, attribute hash)
    intent_version        integer,
    intent_hash           text,
    undefined             boolean NOT NULL DEFAULT false,
    -- compliant | has_update | non_compliant | undefined
    compliance            text NOT NULL DEFAULT 'has_update',
    -- new | successful | failed | skipped
    last_run              text NOT NULL DEFAULT 'new',
    -- what the handler reported last: deployed, failed, skipped, skipped_for_dependency,
    -- unavailable, timed_out, …
    last_result           text,
    last_message          text,
    -- not_blocked | blocked | temporarily_blocked
    blocked               text NOT NULL DEFAULT 'not_blocked',
    -- why it is blocked or skipped, for people
    blocked_reason        text,
    -- attribute hash of the intent of the last run (whatever its result)
    last_run_hash         text,
    -- start of the last run, end of the last run, start of the last successful run
    last_attempt          timestamptz,
    last_deployed         timestamptz,
    last_success          timestamptz,
    -- end of the last run of a send_event resource (events are recovered from it)
    last_produced_events  timestamptz,
    -- consecutive failures and when the next retry is due (exponential backoff)
    failure_count         integer NOT NULL DEFAULT 0,
    next_retry            timestamptz,
    -- a deploy holds the lease while it runs; a stale lease (crash) is simply ignored
    deploying_since       timestamptz,
    -- last version that still contained it (set when it is removed from the model)
    orphaned_after        integer,
    updated_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (environment_id, resource_id)
);
CREATE INDEX resource_state_agent ON resource_state (environment_id, agent);

CREATE TABLE agents (
    environment_id     uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    name               text NOT NULL,
    paused             boolean NOT NULL DEFAULT false,
    -- remembered across a halt: unpause this agent on resume
    unpause_on_resume  boolean NOT NULL DEFAULT false,
    last_seen          timestamptz,
    PRIMARY KEY (environment_id, name)
);

CREATE TABLE scheduler_progress (
    environment_id     uuid PRIMARY KEY REFERENCES environments(id) ON DELETE CASCADE,
    -- the last released version merged into resource_state
    processed_version  integer,
    updated_at         timestamptz NOT NULL DEFAULT now()
);
