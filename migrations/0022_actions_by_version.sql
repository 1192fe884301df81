-- What deploying a version changed (`GET …/versions/{number}/report`, the summary of
-- `steward deploy`) is read from that version's actions. Without this index it reads every
-- action of the environment, or asks for 10,000 of them and misses the rest (a first
-- deploy of 100,000 resources reported 10,000 created).
CREATE INDEX resource_actions_by_version ON resource_actions (environment_id, version);
