"""Test harness shared by tests/, e2e/ and bench/: the one place they all import, so neither of bench
and e2e imports the other (tests/repo/test_repo_layers.py holds that)."""
