"""The web process: the HTTP API in front of the attachments domain (``jobsapp web``)."""
