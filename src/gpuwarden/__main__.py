import sys

from gpuwarden.cli.main import main

sys.exit(main())
