"""Test session set-up: one real PostgreSQL for the whole session.

The server is the embedded one (started once, in a temporary folder), or an existing server
given as an admin DSN in SHOAL_TEST_DSN. Each test cluster is a set of fresh databases on it.
"""

from hypothesis import settings

# Property tests judge answers, never time: Hypothesis's default deadline (200 ms an
# example) fails an example that a loaded machine merely delayed.
settings.register_profile("shoal", deadline=None)
settings.load_profile("shoal")

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.storage",
    "tests.fixtures.serve",
    "tests.fixtures.spark",
    "tests.fixtures.cluster",
    "tests.fixtures.watchdog",
]
