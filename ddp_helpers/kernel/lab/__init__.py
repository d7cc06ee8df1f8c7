"""What the notebooks display and call: plots, tables, source views, checks and cost models."""
