"""What the notebook kernel and a live rank agree on (no imports: both sides load this)."""

import signal

ADDRESS_ENV = "DDP_RANKS_ADDRESS"  # the kernel's Unix socket
AUTHKEY_ENV = "DDP_RANKS_AUTHKEY"  # a random key per start, hex; the rank removes it from its environment
STACKS_ENV = "DDP_RANKS_STACK_DIR"  # where each rank's faulthandler writes its stack on request
STACK_SIGNAL = signal.SIGUSR1  # the kernel asks a stuck rank for its Python stack with this
