"""`python -m streamcheck ...` is the `streamcheck` command."""
import sys

from .cli import main

sys.exit(main())
