-- Rotatable replica secrets (issue 26): the current secret (retire_at IS NULL) and the
-- retired ones, each still accepted until its retire_at (the grace period of
-- `steward server rotate-replica-secret`). Additive: the single-row replica_secret table
-- stays for replicas of the previous release, and a rotation keeps it equal to the current
-- secret.
CREATE TABLE replica_secrets (
    secret     text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    retire_at  timestamptz
);

-- one current secret at most
CREATE UNIQUE INDEX replica_secrets_current ON replica_secrets ((true)) WHERE retire_at IS NULL;

INSERT INTO replica_secrets (secret) SELECT secret FROM replica_secret;
