"""Deployment files shipped with the package: systemd unit templates (deploy/systemd/)."""
