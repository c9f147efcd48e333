"""The conformance suite's deployments: one per broker, started once per module."""
