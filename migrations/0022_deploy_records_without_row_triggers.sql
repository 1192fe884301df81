-- The same trade as 0021, for the two tables every deploy action writes a row of: the
-- foreign key to environments cost a trigger call and a row lock per inserted row
-- (resource_actions: every action; resource_state: every resource's first state).
-- What the keys guaranteed is kept per statement:
--
-- * The scheduler writes both tables only in a transaction that first holds its
--   scheduler_progress row FOR SHARE (store::deploy::holds_epoch), and that row goes with
--   its environment (ON DELETE CASCADE). A delete of the environment waits for such a
--   transaction to end, then removes what it wrote (the trigger below runs after the
--   cascade); a transaction that starts during the delete finds no row and writes nothing.
-- * An action reported through the API (store::actions::upsert) takes a key-share lock on
--   its environment's row in the statement that inserts it, as the key did.
ALTER TABLE resource_actions DROP CONSTRAINT resource_actions_environment_id_fkey;
ALTER TABLE resource_state DROP CONSTRAINT resource_state_environment_id_fkey;

CREATE FUNCTION delete_deploy_records_of_deleted_environments() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM resource_actions a USING deleted_environments d WHERE a.environment_id = d.id;
    DELETE FROM resource_state s USING deleted_environments d WHERE s.environment_id = d.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER environments_delete_deploy_records
    AFTER DELETE ON environments
    REFERENCING OLD TABLE AS deleted_environments
    FOR EACH STATEMENT EXECUTE FUNCTION delete_deploy_records_of_deleted_environments();
