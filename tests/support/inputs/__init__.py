"""Hostile input for the entry points, and what it must leave behind."""
