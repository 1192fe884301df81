-- The resources being deployed right now (the progress document's `working_on`): a handful
-- of rows out of thousands, found without scanning the environment's state.
CREATE INDEX resource_state_deploying ON resource_state (environment_id, deploying_since)
    WHERE deploying_since IS NOT NULL;
