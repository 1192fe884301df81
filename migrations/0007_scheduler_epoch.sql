-- Fencing: each scheduler of an environment takes a new epoch when it starts, and its
-- writes count only while the epoch is still its own. A scheduler that lives on after
-- another took over (a server that was thought dead, a replica) cannot overwrite newer state.
ALTER TABLE scheduler_progress ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
