# Prints its arguments: they must arrive exactly as given, whatever they look like to torchrun.
import sys

print("args:", sys.argv[1:])
