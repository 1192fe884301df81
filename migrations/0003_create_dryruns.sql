-- Dry-runs: what a deploy of a version would change, per resource, without changing it.

CREATE TABLE dryruns (
    id              uuid PRIMARY KEY,
    environment_id  uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    version         integer NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    total           integer NOT NULL,
    done            integer NOT NULL DEFAULT 0,
    requested_by    text NOT NULL
);
CREATE INDEX dryruns_env ON dryruns (environment_id, created_at DESC);

CREATE TABLE dryrun_results (
    dryrun_id    uuid NOT NULL REFERENCES dryruns(id) ON DELETE CASCADE,
    resource_id  text NOT NULL,
    -- dry | failed | unavailable | skipped_for_undefined | agent_paused | …
    outcome      text NOT NULL,
    -- {attribute: {current, desired}}
    changes      jsonb NOT NULL DEFAULT '{}'::jsonb,
    messages     jsonb NOT NULL DEFAULT '[]'::jsonb,
    PRIMARY KEY (dryrun_id, resource_id)
);

-- Actions still open when a scheduler starts were interrupted by a stop: found through this.
CREATE INDEX resource_actions_open ON resource_actions (environment_id) WHERE finished_at IS NULL;
