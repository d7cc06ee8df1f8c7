# Each rank starts a helper that leaves the session, ignores SIGTERM and outlives its parent, then exits at once.
import os
import subprocess
import sys

marker = sys.argv[1]  # on the helper's command line, so the test can look for it
helper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
subprocess.Popen([sys.executable, "-c", helper, marker], start_new_session=True)
if os.fork() == 0:  # and a double fork, whose grandchild escapes the same way
    if os.fork() == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", helper, marker])
    os._exit(0)
print("helpers started", flush=True)
