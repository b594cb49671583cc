"""The store tests' PostgreSQL fixtures (``pg_databases``, ``pg_url``) live in
the root ``tests/conftest.py``: the engine and worker tiers use them too."""
