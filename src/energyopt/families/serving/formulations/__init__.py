"""Festina-style serving: joint placement, SM partitioning and clock selection."""
