"""Scoring new data with a trained checkpoint (`empathic-predict`): a folder of recordings with a fusion
checkpoint (fusion.py), a text table with a text checkpoint (table.py), and the command (command.py)."""
