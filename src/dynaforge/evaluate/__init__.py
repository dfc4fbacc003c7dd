"""Rollouts, metrics, plots and reports."""
