"""No race; exits with its own status (sys.exit(int(argv[1]))), which streamcheck run keeps."""
import os
import sys

import cupy

from _common import buffers, fill

a = cupy.cuda.Stream(non_blocking=True)
(y,) = buffers("y")
with a:
    fill(y, 1)
a.synchronize()
print("argv", sys.argv[1:], "STREAMCHECK_RUN", os.environ.get("STREAMCHECK_RUN"), "name", __name__)
sys.exit(int(sys.argv[1]))
