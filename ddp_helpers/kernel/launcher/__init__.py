"""The kernel side of a launch (`runner.launch`): runs in the notebook kernel or the CLI, never in a rank."""
