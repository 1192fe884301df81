-- Versions stored as spans: a resource's row covers every version from `first_version` to
-- `last_version` (2147483647 while it is in the newest version) in which it was the same
-- (type, agent, attributes, requires, undefined). Storing a version then writes a row per
-- resource it changes, not per resource it holds: a change to one of 100,000 resources
-- writes one span and closes one (issue 31; examples/bench_store.rs).
--
-- Version V holds the rows with first_version <= V AND last_version >= V. The open rows
-- (last_version = 2147483647) are exactly the newest version's. Deleting versions deletes
-- the spans no remaining version lies in, and reopens the newest remaining version's rows
-- when the newest is deleted (store/versions/spans.rs).
CREATE TABLE resource_spans (
    environment_id  uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    resource_id     text NOT NULL,
    first_version   integer NOT NULL,
    last_version    integer NOT NULL DEFAULT 2147483647,
    resource_type   text NOT NULL,
    agent           text NOT NULL,
    hash            text NOT NULL REFERENCES resource_blobs(hash),
    requires        text[] NOT NULL DEFAULT '{}',
    undefined       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (environment_id, resource_id, first_version),
    CHECK (first_version <= last_version)
);

-- the existing versions, as spans: consecutive versions (in the environment's order of the
-- versions that exist) in which a resource is the same make one span (gaps and islands)
INSERT INTO resource_spans (environment_id, resource_id, first_version, last_version,
                            resource_type, agent, hash, requires, undefined)
SELECT environment_id, resource_id, min(version),
       CASE WHEN max(version) = max(newest) THEN 2147483647 ELSE max(version) END,
       resource_type, agent, hash, requires, undefined
FROM (
    SELECT vr.*, vn.newest,
           vn.rank - row_number() OVER (
               PARTITION BY vr.environment_id, vr.resource_id, vr.resource_type, vr.agent,
                            vr.hash, vr.requires, vr.undefined
               ORDER BY vn.rank) AS island
    FROM version_resources vr
    JOIN (SELECT environment_id, number,
                 row_number() OVER (PARTITION BY environment_id ORDER BY number) AS rank,
                 max(number) OVER (PARTITION BY environment_id) AS newest
          FROM versions) vn
      ON vn.environment_id = vr.environment_id AND vn.number = vr.version
) r
GROUP BY environment_id, resource_id, resource_type, agent, hash, requires, undefined, island;

DROP TABLE version_resources;

-- the newest version's rows (last_version = max), and the rows a deleted version closed
CREATE INDEX resource_spans_by_last ON resource_spans (environment_id, last_version);
-- the rows a version (or a run of deleted versions) started
CREATE INDEX resource_spans_by_first ON resource_spans (environment_id, first_version);
-- attributes still referred to (blob collection)
CREATE INDEX resource_spans_by_hash ON resource_spans (hash);
-- the console's resources table pages a version by agent or by type (then id); the span
-- columns let the version filter run on the index alone
CREATE INDEX resource_spans_by_agent
    ON resource_spans (environment_id, agent, resource_id, first_version, last_version);
CREATE INDEX resource_spans_by_type
    ON resource_spans (environment_id, resource_type, resource_id, first_version, last_version);
