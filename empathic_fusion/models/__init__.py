"""Fusion models (encoders + fusion -> representation), heads, and the one LightningModule."""
