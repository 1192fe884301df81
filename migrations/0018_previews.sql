-- Pull-request previews (issue 30, docs/design/previews.md): what merging a pull request
-- would change in an environment. A preview is never a version: its export is diffed against
-- the active version and dropped; what is kept is the report and the diff.

-- A value marked secret reaches branch compiles but never a preview's.
ALTER TABLE parameters ADD COLUMN secret boolean NOT NULL DEFAULT false;

-- One per environment and pull request (or ref previewed by hand).
CREATE TABLE previews (
    id            uuid PRIMARY KEY,
    environment_id uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    ref           text NOT NULL,          -- refs/pull/7/head, or the ref run by hand
    number        integer,                -- the pull request; NULL for a ref by hand
    base_branch   text NOT NULL,
    head_repo     text,
    fork          boolean NOT NULL DEFAULT false,
    -- from the host's payload: shown, never trusted
    title         text NOT NULL DEFAULT '',
    url           text,
    author        text,
    state         text NOT NULL CHECK (state IN ('open', 'closed', 'merged')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    closed_at     timestamptz,
    UNIQUE (environment_id, ref)
);

-- One per head commit previewed.
CREATE TABLE preview_runs (
    id            uuid PRIMARY KEY,
    preview_id    uuid NOT NULL REFERENCES previews(id) ON DELETE CASCADE,
    environment_id uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    head          text NOT NULL,
    base          text,
    merge         text,                   -- the commit compiled
    merge_source  text CHECK (merge_source IN ('host', 'steward')),
    trigger       text NOT NULL,          -- webhook | api
    status        text NOT NULL CHECK (status IN
                    ('queued', 'running', 'success', 'failed', 'superseded', 'skipped')),
    diff_base     integer,                -- the active version diffed against
    summary       jsonb NOT NULL DEFAULT '{}',
    stages        jsonb NOT NULL DEFAULT '[]',
    exit_code     integer,
    stdout        text NOT NULL DEFAULT '',
    stderr        text NOT NULL DEFAULT '',
    diagnostics   jsonb NOT NULL DEFAULT '[]',
    source_lines  jsonb NOT NULL DEFAULT '[]',
    error         text,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz
);
CREATE INDEX preview_runs_queued ON preview_runs (environment_id, requested_at) WHERE status = 'queued';
CREATE INDEX preview_runs_preview ON preview_runs (preview_id, requested_at DESC);

CREATE TABLE preview_diffs (
    run_id        uuid NOT NULL REFERENCES preview_runs(id) ON DELETE CASCADE,
    resource_id   text NOT NULL,
    change        text NOT NULL CHECK (change IN
                    ('new', 'updated', 'deleted', 'undefined', 'withheld', 'requires')),
    attributes    jsonb NOT NULL DEFAULT '{}',   -- {attr: {current, desired}}
    requires      jsonb NOT NULL DEFAULT '{}',   -- {added: [], removed: []}
    PRIMARY KEY (run_id, resource_id)
);

-- The poll's last look at refs/pull/*/head (for sources without webhooks).
CREATE TABLE pull_refs (
    environment_id uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    number        integer NOT NULL,
    head          text NOT NULL,
    PRIMARY KEY (environment_id, number)
);

-- A preview's dry-run (setting previews.dry_run, never for forks): the changed resources
-- with the preview's desired attributes, run through the active version's handler code. The
-- dry-run itself is a `dryruns` row (of the active version) pointing to its run.
ALTER TABLE dryruns ADD COLUMN preview_run uuid REFERENCES preview_runs(id) ON DELETE CASCADE;
CREATE TABLE preview_dryrun_resources (
    dryrun_id     uuid NOT NULL REFERENCES dryruns(id) ON DELETE CASCADE,
    resource_id   text NOT NULL,
    resource_type text NOT NULL,
    agent         text NOT NULL,
    attributes    jsonb NOT NULL,
    PRIMARY KEY (dryrun_id, resource_id)
);

-- The sticky comment, one per pull request and editing token (only its author edits it).
CREATE TABLE preview_comments (
    host          text NOT NULL,          -- kind and API base
    repo          text NOT NULL,
    number        integer NOT NULL,
    token_digest  text NOT NULL,          -- SHA-256 of the status token
    comment_id    bigint,
    body_digest   text,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (host, repo, number, token_digest)
);

-- This installation's id: its comments carry it, so two installations never edit each
-- other's.
CREATE TABLE installation (
    id  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    one boolean NOT NULL DEFAULT true UNIQUE CHECK (one)
);
INSERT INTO installation DEFAULT VALUES;

ALTER TABLE outbox DROP CONSTRAINT outbox_kind_check,
    ADD CONSTRAINT outbox_kind_check CHECK (kind IN ('notify', 'status', 'comment'));
