"""What a broker's background threads do, as plain functions any process may run and re-run:
DeleteRecords, retention and garbage collection, segment merges, flushes, the repair of lost
segments and of the metadata log. The coordinator schedules them; the CLI and the jobs call the
same functions."""
