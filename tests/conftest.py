"""The fixtures live in tests/plugins/, one module per concern; pytest loads them here so
that every test directory gets them without importing fixture names."""

pytest_plugins = ["plugins.projects", "plugins.remote", "plugins.store"]
