-- Handler code shipped by modules: stored with the versions that use it, content-addressed.

CREATE TABLE code_blobs (
    hash     text PRIMARY KEY,
    content  bytea NOT NULL
);

CREATE TABLE version_handlers (
    environment_id  uuid NOT NULL,
    version         integer NOT NULL,
    resource_type   text NOT NULL,
    module          text NOT NULL,
    entry           text NOT NULL,
    -- {path: {"hash", "executable"}}
    files           jsonb NOT NULL,
    digest          text NOT NULL,
    PRIMARY KEY (environment_id, version, resource_type),
    FOREIGN KEY (environment_id, version) REFERENCES versions(environment_id, number) ON DELETE CASCADE
);
