"""Feature extraction from raw media into a per-session, frame-level feature store."""
