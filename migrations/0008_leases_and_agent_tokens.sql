-- Leases: who holds something exclusive (an agent's primary process now; an environment's
-- owning server replica later), for how long, and under which term. A lease is taken and
-- renewed in one statement; the term grows by one whenever the holder changes, and every
-- write the holder makes carries its term, so a holder that lost the lease (paused,
-- partitioned, killed and restarted) is refused instead of writing over its successor.
CREATE TABLE leases (
    kind         text NOT NULL,
    key          text NOT NULL,
    holder       text NOT NULL,
    term         bigint NOT NULL,
    expires_at   timestamptz NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    renewed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, key)
);

-- An agent token may host only the agents it names (NULL: every agent of its environment).
ALTER TABLE tokens ADD COLUMN agents text[];
