-- Web console sessions: the browser holds a random secret in an HttpOnly cookie; the table
-- holds its SHA-256 and the token it was opened with (its role and environment decide what
-- the console offers, as for the API). Revoking or deleting the token ends its sessions.
CREATE TABLE console_sessions (
    secret_hash     text PRIMARY KEY,
    -- NULL: a server started with --no-auth (everyone is a local admin)
    token_id        uuid REFERENCES tokens(id) ON DELETE CASCADE,
    -- the value every form and change request must carry (CSRF)
    csrf            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);
