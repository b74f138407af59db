"""The fixtures live in tests/plugins/, one module per concern; pytest loads them here so
that every test directory gets them without importing fixture names."""

import os

# No build server unless a test asks for one (tests/cli/test_buildserver.py): a server
# outlives the build that started it, and a test must leave no process behind. Set here,
# before any test runs, so that every `optbuild` a test starts inherits it.
os.environ["OPTBUILD_SERVER"] = "0"

pytest_plugins = ["plugins.processes", "plugins.projects", "plugins.remote", "plugins.store"]
