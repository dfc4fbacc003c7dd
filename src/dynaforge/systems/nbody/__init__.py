"""Gravitational N-body systems: physics.py (forces, invariants, integrators), schemes.py (composition
coefficients), initial.py (initial-condition families), control.py (step controllers and the run loop),
system.py (the dataset system)."""
