"""Steady (elliptic) problems on bounded domains: the five-point operator and its batched solver
(five_point.py), one file per problem (darcy.py)."""
