"""Periodic PDEs on the shared pseudo-spectral core (spectral.py, etdrk.py, initial.py): one file per PDE."""
