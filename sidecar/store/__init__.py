"""Everything sidecar keeps on disk: atomic private files, the audit log."""
