"""Collective-communication schedules (``kind: collective``)."""
