"""Systems on bounded intervals and squares with Dirichlet, Neumann or mixed boundary conditions per side:
heat, advection-diffusion, viscous Burgers and Fisher-KPP, in 1D and 2D (`core.py`: grid, boundary
conditions, stepper; `system.py`: the shared config and rollout; one module per equation)."""
