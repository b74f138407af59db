"""The builder: one build's action keys, the executor that decides, builds and restores each
step, how a step's outputs are filed, the lock file and its diff, step statuses, reporters and
run statistics."""
