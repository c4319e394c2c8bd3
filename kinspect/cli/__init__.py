"""The `kinspect` command line."""
