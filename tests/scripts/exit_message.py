# A script that stops with its own message and no traceback, as sys.exit("...") and argparse do.
import sys

sys.exit("bad config: missing X")
