-- The Python environment a compile used (`<environment id>/<name>` under the server's
-- python-envs/): the reaper keeps those of stored versions and removes the others.
ALTER TABLE compiles ADD COLUMN python_env text;
CREATE INDEX compiles_python_env ON compiles (python_env) WHERE python_env IS NOT NULL;
