"""Command-line tools: comparisons, sweeps, audits, export, deployment helpers."""
