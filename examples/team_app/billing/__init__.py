"""A team's billing tasks: the package a deployment names in ``JOBSAPP_IMPORTS``."""
