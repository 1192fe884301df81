-- Server replicas on one database (issue 15). Each running `steward server` has a row it
-- heartbeats; environments are owned under leases of kind 'environment' (table leases),
-- spread over the replicas whose heartbeat is recent. Additive only: a replica of the
-- previous release keeps running against this schema during a rolling upgrade.
CREATE TABLE replicas (
    id            text PRIMARY KEY,
    -- where the other replicas reach it for owner-only calls
    advertise_url text NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    -- set by a graceful stop: others stop counting it at once
    stopping      boolean NOT NULL DEFAULT false,
    -- the steward version it runs (shown in `steward server status`)
    version       text NOT NULL DEFAULT ''
);

-- The secret replicas show each other on owner-only calls; anyone who can read it can
-- already write the database.
CREATE TABLE replica_secret (
    id     boolean PRIMARY KEY DEFAULT true CHECK (id),
    secret text NOT NULL
);

CREATE INDEX leases_holder ON leases (kind, holder);
