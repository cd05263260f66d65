"""The `trimtab` command line."""
