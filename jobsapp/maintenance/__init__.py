"""Maintenance passes hosted by beat (one file each), and beat's leadership lease."""
