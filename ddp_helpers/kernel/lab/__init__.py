"""What the notebooks display and call: plots, tables, source views, checks and cost models.

Runs in the notebook kernel only. It may use the launcher; nothing rank-side imports it.
"""
