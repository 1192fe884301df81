-- Every action updates its resource's `resource_state` row (a repair of 100,000 resources:
-- 100,000 updates). An update whose new row fits on the old one's page, and that changes no
-- indexed column, is HOT: it writes no index entry. Full pages made 40 % of these updates
-- write a new entry in each of the table's indexes (examples/bench_deploy.rs with
-- BENCH_PG_STATS=1: 20,305 of 32,428 updates HOT over three repairs of 10,000). Room left
-- on each page keeps them HOT. Pages written from now on keep it; existing ones get it when
-- the table is rewritten (VACUUM FULL), which is not needed for correctness.
ALTER TABLE resource_state SET (fillfactor = 70);
