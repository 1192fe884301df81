-- Projects, environments, tokens, audit, versions and their resources, approvals, action logs.

CREATE TABLE projects (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE environments (
    id                 uuid PRIMARY KEY,
    project_id         uuid NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    name               text NOT NULL,
    settings           jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- set by a rollback: newer versions wait for an explicit release
    auto_release_held  boolean NOT NULL DEFAULT false,
    halted             boolean NOT NULL DEFAULT false,
    created_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, name)
);

CREATE TABLE tokens (
    id              uuid PRIMARY KEY,
    name            text NOT NULL,
    -- SHA-256 of the secret, hex; the secret itself is never stored
    secret_hash     text NOT NULL UNIQUE,
    role            text NOT NULL CHECK (role IN ('admin', 'approver', 'compiler', 'agent', 'viewer')),
    -- NULL: a global token (only admins may be global)
    environment_id  uuid REFERENCES environments(id) ON DELETE CASCADE,
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    revoked_at      timestamptz,
    last_used_at    timestamptz
);

CREATE TABLE audit_log (
    id              bigserial PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text NOT NULL,
    environment_id  uuid,
    action          text NOT NULL,
    target          text NOT NULL DEFAULT '',
    details         jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_env ON audit_log (environment_id, id);

-- Attributes of resources, content-addressed: unchanged resources share one row across versions.
CREATE TABLE resource_blobs (
    hash        text PRIMARY KEY,
    attributes  jsonb NOT NULL
);

CREATE TABLE versions (
    environment_id  uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    number          integer NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- who uploaded it (token name, "git", "rollback of N", …)
    uploader        text NOT NULL,
    -- push | git | rollback
    origin          text NOT NULL,
    content_hash    text NOT NULL,
    provenance      jsonb NOT NULL DEFAULT '{}'::jsonb,
    metadata        jsonb NOT NULL DEFAULT '{}'::jsonb,
    resource_count  integer NOT NULL,
    -- new | released | rejected
    status          text NOT NULL DEFAULT 'new' CHECK (status IN ('new', 'released', 'rejected')),
    released_at     timestamptz,
    -- counts of new/updated/deleted/unchanged resources against the previous version
    diff_summary    jsonb NOT NULL DEFAULT '{}'::jsonb,
    diff_base       integer,
    PRIMARY KEY (environment_id, number)
);

CREATE TABLE version_resources (
    environment_id  uuid NOT NULL,
    version         integer NOT NULL,
    resource_id     text NOT NULL,
    resource_type   text NOT NULL,
    agent           text NOT NULL,
    hash            text NOT NULL REFERENCES resource_blobs(hash),
    requires        text[] NOT NULL DEFAULT '{}',
    undefined       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (environment_id, version, resource_id),
    FOREIGN KEY (environment_id, version) REFERENCES versions(environment_id, number) ON DELETE CASCADE
);
CREATE INDEX version_resources_by_id ON version_resources (environment_id, resource_id, version);
CREATE INDEX version_resources_by_hash ON version_resources (hash);

-- Per-resource changes of a version against its diff base, computed when it is stored.
CREATE TABLE version_diffs (
    environment_id  uuid NOT NULL,
    version         integer NOT NULL,
    resource_id     text NOT NULL,
    change          text NOT NULL CHECK (change IN ('new', 'updated', 'deleted')),
    -- {attribute: {"current": old, "desired": new}}
    attributes      jsonb NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (environment_id, version, resource_id),
    FOREIGN KEY (environment_id, version) REFERENCES versions(environment_id, number) ON DELETE CASCADE
);

-- Release and reject decisions, bound to the content hash of the version they approve.
CREATE TABLE approvals (
    id              bigserial PRIMARY KEY,
    environment_id  uuid NOT NULL,
    version         integer NOT NULL,
    content_hash    text NOT NULL,
    decision        text NOT NULL CHECK (decision IN ('release', 'reject')),
    approver        text NOT NULL,
    comment         text NOT NULL DEFAULT '',
    at              timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (environment_id, version) REFERENCES versions(environment_id, number) ON DELETE CASCADE
);

-- The action log: one record per handler action on a resource.
CREATE TABLE resource_actions (
    id              uuid PRIMARY KEY,
    environment_id  uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    version         integer NOT NULL,
    resource_id     text NOT NULL,
    -- deploy | dryrun | repair | delete
    action          text NOT NULL,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    status          text NOT NULL,
    -- nochange | created | updated | purged
    change          text NOT NULL DEFAULT 'nochange',
    changes         jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- [{level, message, fields, at}]
    messages        jsonb NOT NULL DEFAULT '[]'::jsonb
);
CREATE INDEX resource_actions_by_resource ON resource_actions (environment_id, resource_id, started_at DESC);
