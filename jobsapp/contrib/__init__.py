"""Bridges to web frameworks whose transactions jobsapp joins (see docs/integrations.md)."""
