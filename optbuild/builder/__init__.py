"""One build: action keys, the scheduler that decides, has built and restores each step, its
remote hits (``remotehit``), the seam to where a step builds (``site``) and the builder for this
host (``local``), the lock file and its diff, step statuses, reporters and run statistics."""
