"""`python -m scaledl.cli ...`: the same as the `scaledl` command."""
import sys

from scaledl.cli import main

sys.exit(main())
