"""Shared parts every fusion model is built from."""
