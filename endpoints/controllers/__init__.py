"""Manifest mode's embedded controllers: what a cluster's controllers would write, computed."""
