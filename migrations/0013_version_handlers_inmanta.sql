-- Inmanta modules' Python handlers (`@provider` classes): what the executor needs beyond the
-- files, {"requirements": [...], "imports": [...]}; NULL for handlers speaking the JSON-lines
-- protocol themselves.
ALTER TABLE version_handlers ADD COLUMN inmanta jsonb;
