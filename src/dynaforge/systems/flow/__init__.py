"""Incompressible flow with walls on a staggered (MAC) grid: the shared core (`mac.py`) and the systems."""
