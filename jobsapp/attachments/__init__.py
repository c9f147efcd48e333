"""Attachment upload validation and image variant rendering."""
