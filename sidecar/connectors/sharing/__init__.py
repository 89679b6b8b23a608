"""Processes one session did not start alone: warm spares (``spares``) and shared processes (``shared``)."""
