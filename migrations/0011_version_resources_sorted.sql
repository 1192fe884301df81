-- The console's resources table pages a version sorted by agent or by type (then id) from
-- these, without sorting the whole version for a late page (100,000 resources:
-- examples/bench_console.rs). The primary key already serves the id order.
CREATE INDEX version_resources_by_agent ON version_resources (environment_id, version, agent, resource_id);
CREATE INDEX version_resources_by_type ON version_resources (environment_id, version, resource_type, resource_id);
