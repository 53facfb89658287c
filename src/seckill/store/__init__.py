"""The SQL system of record: tables, migrations and the ledger the persister writes through."""
