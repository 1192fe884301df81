-- Git sources: an environment that follows a branch, its compiles, webhook deliveries, and
-- what happened to each commit.

CREATE TABLE git_sources (
    environment_id   uuid PRIMARY KEY REFERENCES environments(id) ON DELETE CASCADE,
    url              text NOT NULL,
    branch           text NOT NULL,
    -- sub-directory holding the project (monorepos); '' is the repository root
    path             text NOT NULL DEFAULT '',
    -- secrets: stored, never returned by the API
    token            text,
    ssh_key          text,
    known_hosts      text,
    webhook_secret   text,
    -- seconds between polls; 0 disables polling
    poll_interval    integer NOT NULL DEFAULT 60,
    -- for a repository on this machine: watch its refs (a push is seen at once)
    watch            boolean NOT NULL DEFAULT true,
    compile_timeout  integer NOT NULL DEFAULT 600,
    -- commit status on the git host: none | github | gitea
    status_kind      text NOT NULL DEFAULT 'none' CHECK (status_kind IN ('none', 'github', 'gitea')),
    status_api_url   text,
    status_repo      text,
    status_token     text,
    -- outbound signed webhook for pipeline events
    notify_url       text,
    notify_secret    text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    last_fetch_at    timestamptz,
    last_fetch_error text,
    last_tip         text
);

CREATE TABLE compiles (
    id              uuid PRIMARY KEY,
    environment_id  uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    commit          text NOT NULL,
    branch          text NOT NULL,
    -- webhook | poll | api | hook | watch | push
    trigger         text NOT NULL,
    -- queued | running | success | failed | superseded
    status          text NOT NULL CHECK (status IN ('queued', 'running', 'success', 'failed', 'superseded')),
    superseded_by   uuid,
    requested_at    timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    -- [{"name", "started_at", "ms", "ok", "detail"}]
    stages          jsonb NOT NULL DEFAULT '[]'::jsonb,
    exit_code       integer,
    stdout          text NOT NULL DEFAULT '',
    stderr          text NOT NULL DEFAULT '',
    diagnostics     jsonb NOT NULL DEFAULT '[]'::jsonb,
    error           text,
    version         integer
);
CREATE INDEX compiles_env ON compiles (environment_id, requested_at DESC);
CREATE INDEX compiles_commit ON compiles (environment_id, commit);
CREATE INDEX compiles_queued ON compiles (environment_id, requested_at) WHERE status = 'queued';

CREATE TABLE webhook_deliveries (
    environment_id  uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    delivery_id     text NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (environment_id, delivery_id)
);

-- What happened to a commit, in order: received, compile started/finished, version, released,
-- deployed (and failures), for the timeline and for feedback to the git host.
CREATE TABLE commit_events (
    id              bigserial PRIMARY KEY,
    environment_id  uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    commit          text NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    event           text NOT NULL,
    detail          jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX commit_events_commit ON commit_events (environment_id, commit, id);
