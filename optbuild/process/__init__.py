"""Where a step runs: a child process per step (the spec it is given, the result it leaves),
forked from a fork server that imported the step's tools once, and the pool that starts them."""
