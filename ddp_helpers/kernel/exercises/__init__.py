"""Exercises: the learner writes a lesson's key lines, the workbench runs them on live ranks and names the mistake."""
