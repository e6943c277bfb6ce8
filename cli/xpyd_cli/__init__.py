"""The `xpyd` command line: one entry point dispatching to each component's own CLI."""
