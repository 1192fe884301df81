-- A foreign key costs a trigger call and a row lock per inserted row. The first version of
-- 10,000 resources spent 95 of its 200 ms of span inserts in the two keys of
-- resource_spans (examples/bench_deploy.rs; the same insert by hand: 180-200 ms with both,
-- 96-98 ms without). Both are replaced by what they guaranteed, done per statement:
--
-- * environment_id: the spans of a deleted environment (directly or through its project)
--   are deleted by the statement trigger below. Spans are only written under the
--   environment's row lock (store/versions), which a delete waits for, so none can be
--   written after it.
-- * hash: a span's attributes stay in resource_blobs. A store inserts the blobs it refers
--   to and takes a key-share lock on those that were already there; the blob collector
--   skips a blob it can not lock for update (a store in progress holds it) and deletes the
--   others that no span refers to (store/versions/write.rs).
ALTER TABLE resource_spans DROP CONSTRAINT resource_spans_hash_fkey;
ALTER TABLE resource_spans DROP CONSTRAINT resource_spans_environment_id_fkey;

CREATE FUNCTION delete_spans_of_deleted_environments() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM resource_spans s USING deleted_environments d WHERE s.environment_id = d.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER environments_delete_spans
    AFTER DELETE ON environments
    REFERENCING OLD TABLE AS deleted_environments
    FOR EACH STATEMENT EXECUTE FUNCTION delete_spans_of_deleted_environments();
