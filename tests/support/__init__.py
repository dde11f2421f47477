"""Helpers shared by the tests (real parts only: playbooks, processes, servers)."""
