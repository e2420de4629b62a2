"""The differential etcdctl test's parts (difftest.py is the entry point)."""
