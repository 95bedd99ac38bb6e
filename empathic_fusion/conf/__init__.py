"""The Hydra config tree (pkg://empathic_fusion.conf): one group per concern."""
