"""The project as the user wrote it: optbuild.toml and its recipes (TOML that remembers
where each key was written, templates, matrix steps, overrides), validated into step specs,
and the step graph."""
