"""Metrics: pure functions of predicted and true fields, used by training and evaluation alike.

fields.py (PDEBench's and The Well's field errors), spectra.py (Fourier-band and binned spectral errors,
energy spectra), physics.py (conserved quantities, drifts, spectrum error), horizon.py (curves over the
rollout: geometric mean, time windows, correlation time, high-correlation time), ensemble.py (energy score, spread-error
correlation). Definitions and sources: docs/evaluation.md.
"""
