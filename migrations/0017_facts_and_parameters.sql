-- Parameters and facts (issue 29). A parameter belongs to the environment (resource_id '')
-- and never expires; a fact belongs to one resource (resource_id: its id without version) and
-- expires by default, so that it is renewed. Values are text, as Inmanta's are. `id` names a
-- row for Inmanta's v2 API (facts by id).
CREATE TABLE parameters (
    environment_id  uuid NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    name            text NOT NULL,
    resource_id     text NOT NULL DEFAULT '',
    value           text NOT NULL,
    source          text NOT NULL CHECK (source IN ('user', 'fact', 'plugin', 'report')),
    metadata        jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated         timestamptz NOT NULL DEFAULT now(),
    expires         boolean NOT NULL,
    id              uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    PRIMARY KEY (environment_id, resource_id, name)
);
-- renewal scans: the expiring facts of an environment, oldest first
CREATE INDEX parameters_renewal ON parameters (environment_id, updated) WHERE expires;

-- Unknown values a compile could not resolve, per version: a fact or parameter arriving for
-- one of them marks it resolved (and the version's commit is compiled again).
CREATE TABLE version_unknowns (
    environment_id  uuid NOT NULL,
    version         integer NOT NULL,
    resource_id     text NOT NULL,
    name            text NOT NULL,
    source          text NOT NULL,
    resolved        boolean NOT NULL DEFAULT false,
    PRIMARY KEY (environment_id, version, resource_id, name),
    FOREIGN KEY (environment_id, version) REFERENCES versions(environment_id, number) ON DELETE CASCADE
);
-- a write looks up the unresolved unknowns it answers
CREATE INDEX version_unknowns_open ON version_unknowns (environment_id, resource_id, name) WHERE NOT resolved;
