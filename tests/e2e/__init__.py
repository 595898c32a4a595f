"""Helpers for the end-to-end alerting test (real kvwatch, Prometheus and Alertmanager processes)."""
