"""Decides: the rules file, balance verdicts, the per-job controller and the service that runs it in up and server."""
