-- Resource attributes are kept as the JSON text the store sent (json, not jsonb): nothing
-- queries inside them (they are read whole, by hash), and jsonb made PostgreSQL build its
-- binary form of every attribute set a version brings (100,000 new sets: ~0.3 s of a first
-- store's inserts) and print it back to text on every read. The text is the one the
-- content hash was computed from, keys in the export's order.
ALTER TABLE resource_blobs ALTER COLUMN attributes TYPE json USING attributes::json;
