-- A removed resource that `delete_removed_resources` deletes on its target is marked with
-- its orphan mark (store::deploy::write_batch) until its delete has run: a scheduler that
-- starts (after a crash, a kill, a handover to another replica) finds the mark and deletes
-- it with the intent of the version it was orphaned after (`orphaned_after`), whose
-- resources and handler code version retention then keeps. Before, the delete lived only
-- in the scheduler's memory and was lost with it: the resource stayed on its target.
--
-- Meaningful only while `orphaned_after` is set: a row written over by the resource's
-- return clears it.
ALTER TABLE resource_state ADD COLUMN delete_pending boolean NOT NULL DEFAULT false;

-- A start and version retention ask for the few pending ones among all of an
-- environment's rows.
CREATE INDEX resource_state_delete_pending ON resource_state (environment_id, orphaned_after)
    WHERE delete_pending AND orphaned_after IS NOT NULL;
