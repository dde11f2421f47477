"""Booted Debian test hosts for the roles, molecule and the e2e tier (see README.md beside this file)."""
