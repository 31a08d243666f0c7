import sys

from dcoco.cli import main

sys.exit(main())
